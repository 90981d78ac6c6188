"""Units for durations (seconds as float) and sizes (bytes as int), so config reads
`5 * SECONDS` and `128 * KIB` instead of bare numbers."""

from typing import Final

SECONDS: Final = 1.0
MILLISECONDS: Final = SECONDS / 1000
MINUTES: Final = 60 * SECONDS

BYTES: Final = 1
KIB: Final = 1024 * BYTES
MIB: Final = 1024 * KIB
