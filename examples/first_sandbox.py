"""Runs a Python sandbox through the official cwsandbox client, unchanged.

Needs CWSANDBOX_BASE_URL and CWSANDBOX_API_KEY pointing at a sandboxd gateway
(`make demo` sets both for a `sandboxd dev` on loopback).
"""
import time

from cwsandbox import Sandbox

start = time.monotonic()
with Sandbox.run() as sandbox:  # the client's default image: python:3.11
    sandbox.wait()
    print(f"sandbox {sandbox.sandbox_id} running after {time.monotonic() - start:.2f}s")
    result = sandbox.exec(["python3", "-c", "print(f'2 + 2 = {2 + 2}')"]).result()
    print(result.stdout, end="")
    sandbox.write_file("/tmp/hello.txt", b"hello from sandboxd\n").result()
    print(sandbox.read_file("/tmp/hello.txt").result().decode(), end="")
print(f"done in {time.monotonic() - start:.2f}s")
