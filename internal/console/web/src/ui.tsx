import { useCallback, useEffect, useState } from "preact/hooks";
import { APIError, errText, Violation } from "./api";

// useLoad runs load now, again every `every` ms, and when deps change.
export function useLoad<T>(load: () => Promise<T>, deps: unknown[], every = 3000): [T | undefined, string, () => void] {
  const [v, setV] = useState<T>();
  const [err, setErr] = useState("");
  const run = useCallback(() => {
    load().then((x) => { setV(x); setErr(""); }, (e) => setErr(errText(e)));
  }, deps);
  useEffect(() => {
    run();
    const t = setInterval(run, every);
    return () => clearInterval(t);
  }, [run]);
  return [v, err, run];
}

export function Err({ msg }: { msg: string }) {
  return msg ? <p class="error" role="alert">{msg}</p> : null;
}

export const when = (t?: string) => (t ? new Date(t).toLocaleString() : "–");

// iso is d as an ISO timestamp, "" when d is not a time Date can hold (toISOString
// throws then: a sandbox may set a file's time beyond Date's range, or leave it NaN).
export const iso = (d: Date) => (Number.isFinite(d.getTime()) ? d.toISOString() : "");

// ConfirmButton asks before it acts: its button opens an inline confirmation (an
// alertdialog) whose first button does it; the API's error, if any, is shown under it.
export function ConfirmButton({ label, question, action, disabled, onDone }: {
  label: string; question: string; action: () => Promise<unknown>; disabled?: boolean; onDone?: () => void;
}) {
  const [open, setOpen] = useState(false);
  const [busy, setBusy] = useState(false);
  const [err, setErr] = useState("");
  const go = async () => {
    setBusy(true);
    setErr("");
    try {
      await action();
      setOpen(false);
      onDone?.();
    } catch (e) {
      setErr(errText(e));
    } finally {
      setBusy(false);
    }
  };
  return (
    <span class="confirm-wrap">
      {!open && <button class="danger" onClick={() => setOpen(true)} disabled={disabled}>{label}…</button>}
      {open && (
        <span role="alertdialog" aria-label={question} class="confirm">
          <span>{question}</span>{" "}
          <button class="danger" onClick={go} disabled={busy} autofocus>{label}</button>{" "}
          <button onClick={() => { setOpen(false); setErr(""); }}>Cancel</button>
        </span>
      )}
      <Err msg={err} />
    </span>
  );
}

// JSONDetails shows what the API returned, folded.
export function JSONDetails({ v, summary = "Details" }: { v: unknown; summary?: string }) {
  return (
    <details>
      <summary>{summary}</summary>
      <pre class="json">{JSON.stringify(v, null, 2)}</pre>
    </details>
  );
}

// Failure is a write's refusal as the editors show it: the API's message and reason, each
// field violation, and whether it was an etag (revision) conflict.
export type Failure = { msg: string; violations: Violation[]; conflict: boolean };

export const noFailure: Failure = { msg: "", violations: [], conflict: false };

export function failure(e: unknown): Failure {
  if (e instanceof APIError) return { msg: errText(e), violations: e.violations, conflict: e.reason === "CWSANDBOX_ETAG_MISMATCH" };
  return { msg: errText(e), violations: [], conflict: false };
}

// FailureView shows a Failure: the message (an alert), the field violations and, on a
// conflict, what to do (reload, which loses the edits).
export function FailureView({ f, what, onReload }: { f: Failure; what: string; onReload?: () => void }) {
  return (
    <>
      <Err msg={f.msg} />
      {f.violations.length > 0 && (
        <ul class="error" data-testid="violations">{f.violations.map((v) => <li key={v.field + v.description}><code>{v.field}</code>: {v.description}</li>)}</ul>
      )}
      {f.conflict && onReload && (
        <p class="error">The {what} changed since you opened the editor. <button type="button" onClick={onReload}>Reload it</button> (your edits are lost) or copy them first.</p>
      )}
    </>
  );
}

// newRequestID is a random UUID v4 for a create's request_id (crypto.randomUUID needs
// a secure context; getRandomValues does not).
export function newRequestID(): string {
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}
