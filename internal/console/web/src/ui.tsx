import { useCallback, useEffect, useState } from "preact/hooks";
import { errText } from "./api";

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
