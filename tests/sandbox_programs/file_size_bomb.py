"""Writes one file in 1 MB chunks without end."""
with open("huge.bin", "wb") as f:
    while True:
        f.write(b"\0" * 2**20)
