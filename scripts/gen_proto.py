"""Regenerates the Python modules of the project's .proto files under `proto/`.

    python scripts/gen_proto.py           # rewrite the generated modules (see GROUPS)
    python scripts/gen_proto.py --check   # exit 1 when the committed modules are stale

Each group keeps its .proto files' wire package (e.g. `llm_epp.v1`, file `llm_epp/v1/picker.proto`) while
the generated modules live in a Python package of the project (`llm_epp.api.v1`), so the imports protoc
writes between them are rewritten after generation. gRPC stubs are generated only for groups that declare
a service. Generation is deterministic for a given grpcio-tools version."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import grpc_tools  # type: ignore[import-untyped]

REPO_ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = REPO_ROOT / "proto"
OUTPUT_ROOT = REPO_ROOT / "src"
COMMAND = "python scripts/gen_proto.py"


@dataclass(frozen=True)
class Group:
    protos: tuple[str, ...]  # relative to proto/
    proto_package: str  # where protoc places the modules (the .proto files' directory)
    python_package: str  # where they are committed
    services: bool  # generate gRPC stubs


GROUPS = (
    # the Pick API served by llm-epp
    Group(("llm_epp/v1/picker.proto",), "llm_epp.v1", "llm_epp.api.v1", services=True),
    # model-server request messages decoded by the gRPC request parsers
    Group(
        ("llm_epp/parsers/v1/vllm_engine.proto", "llm_epp/parsers/v1/vertex_prediction.proto"),
        "llm_epp.parsers.v1",
        "llm_epp.plugins.parsers.wire",
        services=False,
    ),
)


def _target(generated: Path, tmp: Path, group: Group) -> Path:
    """`<tmp>/llm_epp/v1/x_pb2.py` -> `llm_epp/api/v1/x_pb2.py` (relative to the output root)."""
    rel = generated.relative_to(tmp / group.proto_package.replace(".", "/"))
    return Path(group.python_package.replace(".", "/")) / rel


def _fix_imports(text: str, group: Group) -> str:
    return text.replace(f"from {group.proto_package} import ", f"from {group.python_package} import ")


def _generate_group(group: Group, well_known: Path) -> dict[Path, str]:
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        cmd = [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{well_known}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            *([f"--grpc_python_out={tmp}"] if group.services else []),
            *(str(PROTO_ROOT / p) for p in group.protos),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"protoc failed:\n{proc.stderr}")
        return {
            _target(f, tmp, group): _fix_imports(f.read_text(), group) for f in sorted(tmp.rglob("*")) if f.is_file()
        }


def generate() -> dict[Path, str]:
    """Runs protoc into scratch directories; returns {path relative to src/: file text}."""
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    out: dict[Path, str] = {}
    for group in GROUPS:
        out.update(_generate_group(group, well_known))
    return out


def stale(out_root: Path = OUTPUT_ROOT) -> list[str]:
    """Generated files that are missing or differ under `out_root` (paths relative to it)."""
    return [
        str(rel)
        for rel, text in generate().items()
        if not (out_root / rel).is_file() or (out_root / rel).read_text() != text
    ]


def write(out_root: Path = OUTPUT_ROOT) -> list[Path]:
    written = []
    for rel, text in generate().items():
        path = out_root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(rel)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale generated modules")
    args = parser.parse_args(argv)
    if args.check:
        bad = stale()
        if bad:
            print(f"stale generated modules: {', '.join(bad)}; run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    for rel in write():
        print(f"wrote src/{rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
