from __future__ import annotations

from tests.mutants.run import main

raise SystemExit(main())
