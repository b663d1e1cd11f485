"""The workload of the endpoint tests: an HTTP server on 8080 (page, header echo,
server-sent events, WebSocket echo; standard library only) and a TLS server on 8443 that
answers with the SNI it received, using its own certificate (/certs)."""
import base64, hashlib, json, socket, ssl, struct, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, body, ctype="text/plain"):
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/headers":
            return self.reply(json.dumps({k.lower(): v for k, v in self.headers.items()}), "application/json")
        if self.path == "/sse":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            for i in range(3):
                self.wfile.write(f"data: tick {i}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.3)
            self.close_connection = True
            return
        if self.path == "/ws":
            return self.websocket()
        return self.reply("hello from the sandbox\n")

    def websocket(self):
        accept = base64.b64encode(hashlib.sha1((self.headers["Sec-WebSocket-Key"] + WS_GUID).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            opcode, n = head[0] & 0x0F, head[1] & 0x7F
            if n == 126:
                n = struct.unpack(">H", self.rfile.read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self.rfile.read(8))[0]
            mask = self.rfile.read(4)
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(n)))
            if opcode == 8:  # close: answer and end
                self.wfile.write(b"\x88\x00")
                self.wfile.flush()
                self.close_connection = True
                return
            reply = b"echo: " + payload
            frame = bytes([0x81]) + (bytes([len(reply)]) if len(reply) < 126 else bytes([126]) + struct.pack(">H", len(reply)))
            self.wfile.write(frame + reply)
            self.wfile.flush()


def tls_server():
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain("/certs/server.pem", "/certs/server-key.pem")
    state = {}  # one connection at a time: the SNI of the current handshake
    ctx.sni_callback = lambda sock, name, _ctx: state.__setitem__("sni", name)
    ls = socket.create_server(("0.0.0.0", 8443))
    while True:
        conn, _ = ls.accept()
        state.clear()
        try:
            with ctx.wrap_socket(conn, server_side=True) as tls:
                tls.sendall(f"sni:{state.get('sni')}\n".encode())
        except (OSError, ssl.SSLError):
            pass


if __name__ == "__main__":
    threading.Thread(target=tls_server, daemon=True).start()
    ThreadingHTTPServer(("0.0.0.0", 8080), Handler).serve_forever()
