"""Export a trained run as one folder to hand to someone (`davir-export`, `python -m davir.export`; docs/sharing.md).

    from davir.export import export_run
    export_run("runs/demo", "exports/demo")                       # + base_model= when captioning it
    export_run("runs/demo", "exports/demo-merged", merge=True)    # a plain folder of the model's family

Modules: layout (the files, davir_export.json), preprocessing (settings out of the caches), weights (adapter,
merge), card (README.md), exporter (export_run), loading (an exported DAVIR model back).
"""

from davir.export.exporter import ExportOptions, export_run
from davir.export.layout import is_export, read_export_info

__all__ = ["ExportOptions", "export_run", "is_export", "read_export_info"]
