"""Regenerates the Python modules of the project's own gRPC API from `proto/`.

    python scripts/gen_proto.py           # rewrite src/llm_epp/api/v1/picker_pb2{,_grpc}.py{,i}
    python scripts/gen_proto.py --check   # exit 1 when the committed modules are stale

The .proto files keep their wire package (`llm_epp.v1`, file `llm_epp/v1/picker.proto`) while the
generated modules live under `llm_epp.api.v1`, so the one import protoc writes between them is
rewritten after generation. Generation is deterministic for a given grpcio-tools version."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import grpc_tools  # type: ignore[import-untyped]

REPO_ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = REPO_ROOT / "proto"
OUTPUT_ROOT = REPO_ROOT / "src"
PROTOS = ("llm_epp/v1/picker.proto",)
PROTO_PACKAGE = "llm_epp.v1"  # where protoc places the modules (the .proto's directory)
PYTHON_PACKAGE = "llm_epp.api.v1"  # where they are committed
COMMAND = "python scripts/gen_proto.py"


def _target(generated: Path, tmp: Path) -> Path:
    """`<tmp>/llm_epp/v1/x_pb2.py` -> `llm_epp/api/v1/x_pb2.py` (relative to the output root)."""
    rel = generated.relative_to(tmp / PROTO_PACKAGE.replace(".", "/"))
    return Path(PYTHON_PACKAGE.replace(".", "/")) / rel


def _fix_imports(text: str) -> str:
    return text.replace(f"from {PROTO_PACKAGE} import ", f"from {PYTHON_PACKAGE} import ")


def generate() -> dict[Path, str]:
    """Runs protoc into a scratch directory; returns {path relative to src/: file text}."""
    well_known = Path(grpc_tools.__file__).parent / "_proto"
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
            f"--grpc_python_out={tmp}",
            *(str(PROTO_ROOT / p) for p in PROTOS),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"protoc failed:\n{proc.stderr}")
        return {_target(f, tmp): _fix_imports(f.read_text()) for f in sorted(tmp.rglob("*")) if f.is_file()}


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
