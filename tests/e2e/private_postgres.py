"""A throwaway PostgreSQL cluster for tests that stop the database under a running process:
its own data folder and port, never the shared server other sessions use. Debian's server
binaries (`/usr/lib/postgresql/<version>/bin`) run as the `postgres` user when we are root
(initdb refuses root)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

from tests.e2e.conftest import free_port


def server_binaries() -> Path | None:
    """The newest PostgreSQL server's bin folder, or None when none is installed."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: p.parts[-3])
    return found[-1].parent if found else None


@dataclass
class PrivatePostgres:
    bin_dir: Path
    folder: Path
    port: int
    as_user: list[str]

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def url(self) -> str:
        return f"postgresql://ratifier:ratifier@127.0.0.1:{self.port}/ratifier"

    def _ctl(self, *args: str) -> None:
        subprocess.run(
            [*self.as_user, str(self.bin_dir / "pg_ctl"), "-D", str(self.data), *args],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._ctl("-o", options, "-l", str(self.folder / "server.log"), "-w", "start")

    def crash(self) -> None:
        """Stop at once, as a crash or a hard restart would: every connection is cut."""
        self._ctl("-m", "immediate", "-w", "stop")

    def stop(self) -> None:
        self._ctl("-m", "fast", "-w", "stop")


@contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    """A fresh cluster with the `ratifier` role and database, started; removed afterwards."""
    bin_dir = server_binaries()
    if bin_dir is None:
        raise RuntimeError("no PostgreSQL server binaries under /usr/lib/postgresql")
    folder = Path(tempfile.mkdtemp(prefix="ratifier-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        os.chown(folder, owner.pw_uid, owner.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    server = PrivatePostgres(bin_dir=bin_dir, folder=folder, port=free_port(), as_user=as_user)
    try:
        subprocess.run(
            [
                *as_user,
                str(bin_dir / "initdb"),
                "-D",
                str(server.data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        server.start()
        admin = f"postgresql://postgres@127.0.0.1:{server.port}/postgres"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("CREATE ROLE ratifier LOGIN PASSWORD 'ratifier'")
            conn.execute("CREATE DATABASE ratifier OWNER ratifier")
        yield server
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            server.stop()  # unless already stopped (or never started)
        shutil.rmtree(folder, ignore_errors=True)
