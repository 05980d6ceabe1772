"""V3 keystores (eth-keyfile) and the deterministic dev accounts of a testnet."""

from __future__ import annotations

import getpass
import json
import sys
import time
from pathlib import Path

from eth_hash.auto import keccak
from eth_keyfile import create_keyfile_json, decode_keyfile_json
from eth_keys import keys

from cli.errors import CliError

DEV_ACCOUNT_SEED = b"pbft-chain dev account "
DEV_VALIDATOR_SEED = b"pbft-chain validator "  # the validator keys of a local testnet
# scrypt's N for a key whose password lies beside it (a local testnet's well-known keys): geth's
# `--lightkdf` (LightScryptN). The standard N (2**18) costs ~0.6 s of a core to write and as
# much at every start of the node that unlocks it, and protects nothing there.
LIGHT_SCRYPT_N = 1 << 12


def dev_private_key(index: int, seed: bytes = DEV_ACCOUNT_SEED) -> keys.PrivateKey:
    """Well-known test keys (like anvil's): never use them on a chain with real value."""
    return keys.PrivateKey(keccak(seed + str(index).encode()))


def read_password(password_file: str | None, *, confirm: bool = False) -> str:
    if password_file:
        try:
            return Path(password_file).read_text().rstrip("\r\n")
        except OSError as exc:
            raise CliError(f"cannot read password file {password_file}: {exc.strerror}") from None
    if not sys.stdin.isatty():
        raise CliError("no password given: pass --password-file FILE")
    password = getpass.getpass("Password: ")
    if confirm and getpass.getpass("Repeat password: ") != password:
        raise CliError("passwords do not match")
    return password


def write_keyfile(keystore: Path, private_key: keys.PrivateKey, password: str,
                  scrypt_n: int | None = None) -> Path:
    """A V3 keystore file for `private_key`; scrypt's N is eth-keyfile's standard (2**18)
    unless given."""
    keystore.mkdir(parents=True, exist_ok=True)
    document = create_keyfile_json(private_key.to_bytes(), password.encode(), kdf="scrypt",
                                   iterations=scrypt_n)
    stamp = time.strftime("%Y-%m-%dT%H-%M-%S", time.gmtime())
    path = keystore / f"UTC--{stamp}Z--{document['address']}"
    path.write_text(json.dumps(document))
    path.chmod(0o600)
    return path


def list_keyfiles(keystore: Path) -> list[tuple[str, Path]]:
    """(0x-address, path) of every keyfile in `keystore`, sorted by file name."""
    if not keystore.is_dir():
        raise CliError(f"keystore {keystore} is not a directory")
    found = []
    for path in sorted(keystore.iterdir()):
        try:
            address = json.loads(path.read_text())["address"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        found.append(("0x" + address.lower().removeprefix("0x"), path))
    return found


def unlock_keyfile(path: Path, password: str) -> keys.PrivateKey:
    try:
        return keys.PrivateKey(decode_keyfile_json(json.loads(path.read_text()), password.encode()))
    except ValueError as exc:
        raise CliError(f"cannot unlock {path.name}: {exc}") from None
