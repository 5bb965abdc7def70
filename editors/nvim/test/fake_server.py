"""A stand-in for `tensorlang lsp` in the Neovim tests.

Speaks just enough LSP over stdio (initialize, shutdown, exit) and appends every method it
receives, and the root it was started for, to the log file named by its first argument.
"""
import json
import sys


def read_message(stream):
    length = None
    while True:
        line = stream.readline()
        if not line:
            return None
        line = line.strip()
        if not line:
            break
        name, _, value = line.decode("ascii").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    return json.loads(stream.read(length))


def send(stream, message):
    body = json.dumps(message).encode("utf-8")
    stream.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    stream.flush()


def main():
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    with open(sys.argv[1], "a", buffering=1) as log:
        while True:
            message = read_message(stdin)
            if message is None:
                return
            method = message.get("method")
            log.write(f"{method}\n")
            reply = {"jsonrpc": "2.0", "id": message.get("id")}
            if method == "initialize":
                log.write(f"rootUri {message['params'].get('rootUri')}\n")
                reply["result"] = {"capabilities": {"textDocumentSync": 1}}
            elif method == "shutdown":
                reply["result"] = None
            elif method == "exit":
                return
            elif "id" in message:
                reply["error"] = {"code": -32601, "message": f"{method} not supported"}
            if "id" in message:
                send(stdout, reply)


if __name__ == "__main__":
    main()
