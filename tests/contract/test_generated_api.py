"""The committed modules under src/llm_epp/api/ and src/llm_epp/plugins/parsers/wire/ must be what
scripts/gen_proto.py generates from proto/ today: edit the .proto, regenerate, commit both."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO_ROOT = Path(__file__).resolve().parents[2]
SRC = REPO_ROOT / "src"
FIX = "run `python scripts/gen_proto.py` and commit the result"


def _gen_proto() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_gen_proto", REPO_ROOT / "scripts" / "gen_proto.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


def test_committed_modules_match_the_protos() -> None:
    generated: dict[Path, str] = _gen_proto().generate()
    assert generated, "protoc generated nothing"
    missing = [str(rel) for rel in generated if not (SRC / rel).is_file()]
    assert not missing, f"generated modules missing from src/: {missing}; {FIX}"
    stale = [str(rel) for rel, text in generated.items() if (SRC / rel).read_text() != text]
    assert not stale, f"generated modules are stale: {stale}; {FIX}"


def test_no_leftover_generated_modules() -> None:
    generated = {SRC / rel for rel in _gen_proto().generate()}
    roots = (SRC / "llm_epp" / "api", SRC / "llm_epp" / "plugins" / "parsers" / "wire")
    committed = {p for root in roots for p in root.rglob("*_pb2*") if p.suffix in (".py", ".pyi")}
    leftover = sorted(str(p.relative_to(SRC)) for p in committed - generated)
    assert not leftover, f"generated modules without a .proto: {leftover}; delete them"


def test_generated_modules_import_under_the_package() -> None:
    from llm_epp.api.v1 import picker_pb2, picker_pb2_grpc

    service = picker_pb2.DESCRIPTOR.services_by_name["EndpointPicker"]
    assert service.full_name == "llm_epp.v1.EndpointPicker"
    assert {m.name for m in service.methods} == {"Pick", "Release", "ListEndpoints"}
    assert hasattr(picker_pb2_grpc, "EndpointPickerStub")
