"""Silence Beam's routine noise, for a command line whose own progress line and summary say what matters.

No Beam import here: this only sets the `apache_beam` logger and the warning filters that
Beam's worker processes inherit.
"""

from __future__ import annotations

import logging
import os
import warnings

# Beam pins grpcio below the version google-cloud wants; the FutureWarnings this causes (in this process
# and in every Beam worker, which inherit PYTHONWARNINGS) are not actionable for hbpe users
_GOOGLE_FUTURE_WARNINGS = (
    "ignore::FutureWarning:google.api_core._python_package_support,ignore::FutureWarning:google.auth.transport.grpc"
)


def quiet_beam() -> None:
    """Beam logs only errors; google's FutureWarnings are ignored here and in Beam's workers. Idempotent."""
    # Beam logs every worker start at INFO/WARNING
    logging.getLogger("apache_beam").setLevel(logging.ERROR)
    if _GOOGLE_FUTURE_WARNINGS not in os.environ.get("PYTHONWARNINGS", ""):  # once, also when called many times
        os.environ["PYTHONWARNINGS"] = ",".join(
            filter(None, [os.environ.get("PYTHONWARNINGS"), _GOOGLE_FUTURE_WARNINGS])
        )
    warnings.filterwarnings("ignore", message=".*Post-Quantum Cryptography.*", category=FutureWarning)
