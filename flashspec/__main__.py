"""`python -m flashspec ...` (and `torchrun --nproc-per-node N -m flashspec generate --tp ...`): the CLI."""
from flashspec.cli import main

raise SystemExit(main())
