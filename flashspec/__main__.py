"""`python -m flashspec ...` (and `torchrun --nproc-per-node N -m flashspec generate --tp ...`): the CLI."""
from flashspec.cli import main

if __name__ == "__main__":  # importing the module (tools that walk the package) must not run the CLI
    raise SystemExit(main())
