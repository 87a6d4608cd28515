"""The first names of our Mosaic GPU kernels stay importable: the same objects as the package's."""

import attention_tutorial.kernels.mosaic as mosaic
import attention_tutorial.kernels.mosaic.fp8 as fp8
import attention_tutorial.kernels.mosaic_flash as mosaic_flash
import attention_tutorial.kernels.mosaic_fp8 as mosaic_fp8


def test_every_public_name_is_the_packages_own():
    for name in mosaic.__all__:
        assert getattr(mosaic_flash, name) is getattr(mosaic, name), name
    assert set(mosaic.__all__) <= set(mosaic_flash.__all__)
    for name in mosaic_fp8.__all__:
        assert getattr(mosaic_fp8, name) is getattr(fp8, name), name
    assert {"mosaic_fp8_attention", "quantize_e4m3", "E4M3_MAX"} <= set(mosaic_fp8.__all__)


def test_no_private_name_crosses_a_module_of_the_package():
    import ast
    from pathlib import Path

    for path in Path(mosaic.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path.name} imports {private} from {node.module}"
