"""DVC stage `fetch`: download Fashion-MNIST from `data.mirrors`, verify each file's MD5
against `data.md5`, convert it once to uint8 arrays in data/fashion-mnist/.

Mirrors are tried in order (http(s)://, file:// or a plain directory). A failure leaves
nothing half-written: the previous data/fashion-mnist/, if any, stays as it was.
"""

from __future__ import annotations

from typing import Optional

from pipeline.cli import parse_args
from pipeline.config import load_config
from pipeline.data.download import fetch
from pipeline.data.fashion_mnist import DATA_DIR
from pipeline.errors import exit_on_user_error


@exit_on_user_error
def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args("pipeline.fetch", __doc__, argv, params_help=True)
    cfg = load_config("params.yaml", args.overrides)
    arrays = fetch(cfg.data)
    sizes = {k: v.shape for k, v in arrays.items() if k.endswith("images")}
    print(f"fetch: wrote {DATA_DIR} ({sizes})", flush=True)


if __name__ == "__main__":
    main()
