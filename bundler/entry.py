"""PyInstaller entry script of the multicall bundle: every entry is a symlink to the one executable and
cni.__main__ dispatches on the name it was called by (sys.argv[0] keeps the symlink's name under the
PyInstaller bootloader; sys.executable is the resolved bundle)."""

from cni.__main__ import run

run()
