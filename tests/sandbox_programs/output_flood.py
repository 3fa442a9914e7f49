"""Writes to stdout and stderr without end."""
import sys

line = "flood " * 1000 + "\n"
while True:
    sys.stdout.write(line)
    sys.stderr.write(line)
