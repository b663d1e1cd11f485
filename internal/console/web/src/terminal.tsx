import { useEffect, useRef, useState } from "preact/hooks";
import { Terminal } from "@xterm/xterm";
import { FitAddon } from "@xterm/addon-fit";

// SandboxTerminal is an interactive shell in the sandbox: a WebSocket to the console,
// which bridges it to StreamExec with a TTY. Binary messages carry the terminal's bytes,
// text messages resizes (to the server) and the end of the command (from it).
export function SandboxTerminal({ id }: { id: string }) {
  const el = useRef<HTMLDivElement>(null);
  const [status, setStatus] = useState("connecting…");
  useEffect(() => {
    const term = new Terminal({ cursorBlink: true, fontSize: 14, convertEol: false, screenReaderMode: false });
    const fit = new FitAddon();
    term.loadAddon(fit);
    term.open(el.current!);
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(`${proto}//${location.host}/console/api/sandboxes/${encodeURIComponent(id)}/terminal`);
    ws.binaryType = "arraybuffer";
    const enc = new TextEncoder();
    const resize = () => {
      try { fit.fit(); } catch { /* not visible */ }
      if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "resize", cols: term.cols, rows: term.rows }));
    };
    ws.onopen = () => { setStatus("connected"); resize(); term.focus(); };
    ws.onmessage = (ev) => {
      if (typeof ev.data === "string") {
        const m = JSON.parse(ev.data);
        setStatus(m.type === "exit" ? `exited (${m.code})` : `error: ${m.message}`);
        return;
      }
      term.write(new Uint8Array(ev.data));
    };
    ws.onclose = () => setStatus((s) => (s === "connected" || s === "connecting…" ? "disconnected" : s));
    const input = term.onData((d) => ws.readyState === WebSocket.OPEN && ws.send(enc.encode(d)));
    const ro = new ResizeObserver(resize);
    ro.observe(el.current!);
    return () => { ro.disconnect(); input.dispose(); ws.close(); term.dispose(); };
  }, [id]);
  return (
    <section aria-labelledby="term-h">
      <h3 id="term-h">Terminal <span class="muted" role="status" data-testid="term-status">{status}</span></h3>
      <div class="terminal" ref={el} data-testid="terminal" />
    </section>
  );
}
