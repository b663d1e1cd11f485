import { useState } from "preact/hooks";
import { api, errText, Who } from "./api";
import { ConfirmButton, Err, failure, Failure, FailureView, iso, JSONDetails, noFailure, useLoad, when } from "./ui";
import { Template, TemplateEditor, Volume, VolumeEditor } from "./edit";

type ApiKey = { keyId: string; displayName?: string; role?: string; createTime?: string; revokeTime?: string; lastUsedTime?: string };

const roleName = (r?: string) => (r || "SANDBOX_USER").replace("SANDBOX_", "").toLowerCase();

// ApiKeys lists the organization's API keys (ApiKeyService: admin keys only; a user key
// is shown the API's refusal), creates one (its secret shown once, until dismissed) and
// revokes them.
export function ApiKeys({ who }: { who: Who }) {
  const [keys, err, reload] = useLoad(() => api<{ apiKeys?: ApiKey[] }>("GET", "sandbox/apiKeys?pageSize=1000").then((r) => r.apiKeys || []), [], 10000);
  const [name, setName] = useState("");
  const [role, setRole] = useState("SANDBOX_USER");
  const [created, setCreated] = useState<{ keyId: string; secret: string } | null>(null);
  const [copied, setCopied] = useState("");
  const [createErr, setCreateErr] = useState("");
  const [busy, setBusy] = useState(false);
  const create = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    setCreateErr("");
    setCreated(null);
    try {
      const r = await api<{ apiKey?: ApiKey; secret: string }>("POST", "sandbox/apiKeys", { displayName: name.trim(), role });
      setCreated({ keyId: r.apiKey?.keyId || "", secret: r.secret });
      setCopied("");
      setName("");
      reload();
    } catch (x) {
      setCreateErr(errText(x));
    } finally {
      setBusy(false);
    }
  };
  const copy = async () => {
    try {
      await navigator.clipboard.writeText(created!.secret);
      setCopied("Copied.");
    } catch {
      const r = document.createRange();
      r.selectNodeContents(document.querySelector('[data-testid="new-secret"]')!);
      getSelection()?.removeAllRanges();
      getSelection()?.addRange(r);
      setCopied("Selected: copy it with your keyboard.");
    }
  };
  return (
    <main>
      <h2>API keys</h2>
      <form class="filters" onSubmit={create} aria-label="Create an API key">
        <label>Name{" "}<input name="keyname" value={name} maxLength={200} onInput={(e) => setName((e.target as HTMLInputElement).value)} placeholder="e.g. ci" /></label>
        <label>Role{" "}
          <select name="role" value={role} onChange={(e) => setRole((e.target as HTMLSelectElement).value)}>
            <option value="SANDBOX_USER">user</option>
            <option value="SANDBOX_ADMIN">admin</option>
          </select>
        </label>
        <button type="submit" disabled={busy}>Create key</button>
      </form>
      <Err msg={createErr} />
      {created && (
        <div class="secret" role="status" data-testid="created-key">
          <p>Key <code>{created.keyId}</code> created. Copy its secret now: it is shown only this once.</p>
          <code data-testid="new-secret">{created.secret}</code>{" "}
          <button onClick={copy}>Copy</button>{" "}
          <button onClick={() => setCreated(null)}>Done</button>{" "}
          <span class="muted">{copied}</span>
        </div>
      )}
      <Err msg={err} />
      {keys && (
        <div class="scroll"><table data-testid="key-list">
          <thead><tr><th scope="col">Key</th><th scope="col">Name</th><th scope="col">Role</th><th scope="col">Created</th><th scope="col">Last used</th><th scope="col">Status</th><th scope="col"><span class="sr">Action</span></th></tr></thead>
          <tbody>{keys.map((k) => (
            <tr key={k.keyId} data-key={k.keyId}>
              <td><code>{k.keyId}</code>{k.keyId === who.keyId && <span class="muted"> (this session)</span>}</td>
              <td>{k.displayName || "–"}</td>
              <td>{roleName(k.role)}</td>
              <td>{when(k.createTime)}</td>
              <td>{when(k.lastUsedTime)}</td>
              <td>{k.revokeTime ? <span class="badge st-failed">revoked {when(k.revokeTime)}</span> : <span class="badge st-running">active</span>}</td>
              <td>{!k.revokeTime && (
                <ConfirmButton label="Revoke" question={`Revoke key ${k.keyId}${k.keyId === who.keyId ? " (this session's: you will be signed out)" : ""}? Calls with it fail at once.`}
                  action={() => api("POST", `sandbox/apiKeys/${encodeURIComponent(k.keyId)}:revoke`, {})} onDone={reload} />
              )}</td>
            </tr>))}
          </tbody>
        </table></div>
      )}
    </main>
  );
}

type Col<T> = [string, (x: T) => preact.ComponentChild];

// ResourceList is a list of one kind of resource with each item's details (as the API
// returned them), its editor where there is one (opened above the list by the item's
// Edit button; the API refuses what the key may not do) and, where the API allows it,
// its deletion after a confirmation.
function ResourceList<T>({ title, path, field, id, cols, del, testid, empty, editor }: {
  title: string; path: string; field: string; id: (x: T) => string; cols: Col<T>[]; del?: (x: T) => string; testid: string; empty: string;
  editor?: (x: T, close: () => void, saved: (msg: string) => void) => preact.ComponentChild;
}) {
  const [items, err, reload] = useLoad(() => api<Record<string, T[]>>("GET", path).then((r) => r[field] || []), [path], 10000);
  const [editing, setEditing] = useState("");
  const [saved, setSaved] = useState("");
  const cur = editing ? (items || []).find((x) => id(x) === editing) : undefined;
  return (
    <main>
      <h2>{title}</h2>
      <Err msg={err} />
      {saved && <p class="muted" role="status" data-testid="saved">{saved}</p>}
      {editor && cur && editor(cur, () => setEditing(""), (msg) => { setEditing(""); setSaved(msg); reload(); })}
      {items && items.length === 0 && <p class="muted">{empty}</p>}
      {items && items.length > 0 && (
        <div class="scroll"><table data-testid={testid}>
          <thead><tr>{cols.map(([h]) => <th scope="col" key={h}>{h}</th>)}<th scope="col">Details</th>{(editor || del) && <th scope="col"><span class="sr">Actions</span></th>}</tr></thead>
          <tbody>{items.map((x) => (
            <tr key={id(x)} data-id={id(x)}>
              {cols.map(([h, f]) => <td key={h}>{f(x)}</td>)}
              <td><JSONDetails v={x} /></td>
              {(editor || del) && <td>
                {editor && <button class="edit" onClick={() => { setSaved(""); setEditing(id(x)); }} aria-label={`Edit ${id(x)}`}>Edit…</button>}{" "}
                {del && <ConfirmButton label="Delete" question={`Delete ${id(x)}?`} action={() => api("DELETE", del(x))} onDone={reload} />}
              </td>}
            </tr>))}
          </tbody>
        </table></div>
      )}
    </main>
  );
}

type Snapshot = { fileSystemSnapshotId: string; state?: string; stateReason?: string; sizeBytes?: string; sourceSandboxId?: string; createTime?: string };
const enc = encodeURIComponent;
const lower = (s?: string, prefix = "") => (s || "–").replace(prefix, "").toLowerCase();

export const Templates = () => (
  <ResourceList<Template> title="Templates" path="sandboxTemplates?pageSize=500" field="sandboxTemplates" testid="template-list" empty="No template."
    id={(t) => t.sandboxTemplateId} del={(t) => `sandboxTemplates/${enc(t.sandboxTemplateId)}`}
    editor={(t, close, saved) => <TemplateEditor id={t.sandboxTemplateId} onClose={close} onSaved={saved} key={t.sandboxTemplateId} />}
    cols={[["Template", (t) => <code>{t.sandboxTemplateId}</code>], ["Name", (t) => t.displayName || "–"], ["Revision", (t) => t.revision || "–"],
      ["Image", (t) => t.spec?.containers?.[0]?.image || "–"], ["Updated", (t) => when(t.updateTime || t.createTime)]]} />
);

export const Volumes = () => (
  <ResourceList<Volume> title="Volumes" path="volumes?pageSize=500" field="volumes" testid="volume-list" empty="No volume."
    id={(v) => v.volumeId} del={(v) => `volumes/${enc(v.volumeId)}`}
    editor={(v, close, saved) => <VolumeEditor v={v} onClose={close} onSaved={saved} key={v.volumeId} />}
    cols={[["Volume", (v) => <code>{v.volumeId}</code>], ["State", (v) => lower(v.status?.state, "VOLUME_STATE_")], ["Reason", (v) => v.status?.stateReason || "–"],
      ["Size", (v) => v.spec?.size || v.status?.capacity || "–"], ["Read-only", (v) => (v.spec?.readOnly ? "yes" : "no")], ["Description", (v) => v.spec?.description || "–"]]} />
);

export const Snapshots = () => (
  <ResourceList<Snapshot> title="Snapshots" path="fileSystemSnapshots?pageSize=500" field="fileSystemSnapshots" testid="snapshot-list" empty="No snapshot."
    id={(s) => s.fileSystemSnapshotId} del={(s) => `fileSystemSnapshots/${enc(s.fileSystemSnapshotId)}`}
    cols={[["Snapshot", (s) => <code>{s.fileSystemSnapshotId}</code>], ["State", (s) => lower(s.state, "SNAPSHOT_STATE_")], ["Reason", (s) => s.stateReason || "–"],
      ["Size", (s) => (s.sizeBytes ? `${(Number(s.sizeBytes) / (1 << 20)).toFixed(1)} MiB` : "–")],
      ["Sandbox", (s) => (s.sourceSandboxId ? <a href={`#/sandboxes/${enc(s.sourceSandboxId)}`}>{s.sourceSandboxId}</a> : "–")], ["Created", (s) => when(s.createTime)]]} />
);

type AuditEvent = { eventId: string; time?: string; orgId?: string; keyId?: string; sourceAddress?: string; method?: string; kind?: string; targetType?: string; targetId?: string; result?: string; reason?: string; message?: string; actorOrgId?: string };

// rfc3339 turns a datetime-local value (the browser's time zone) into a timestamp.
const rfc3339 = (v: string) => (v ? iso(new Date(v)) : "");

// Audit lists the audit log (ListAuditEvents: admin keys only), newest first as the API
// returns it, filtered by actor (API key), action (method), result and time range.
export function Audit() {
  const [f, setF] = useState({ keyId: "", method: "", result: "", start: "", end: "" });
  const [applied, setApplied] = useState(f);
  const [pages, setPages] = useState<string[]>([""]);
  const q = (token: string) => {
    const p = new URLSearchParams({ pageSize: "100" });
    if (applied.keyId) p.set("keyId", applied.keyId.trim());
    if (applied.method) p.set("method", applied.method.trim());
    if (applied.result) p.set("result", applied.result);
    if (applied.start) p.set("startTime", rfc3339(applied.start));
    if (applied.end) p.set("endTime", rfc3339(applied.end));
    if (token) p.set("pageToken", token);
    return "auditEvents?" + p.toString();
  };
  const token = pages[pages.length - 1];
  const [page, err] = useLoad(() => api<{ events?: AuditEvent[]; nextPageToken?: string }>("GET", q(token)), [applied, token], 10000);
  const set = (k: keyof typeof f) => (e: Event) => setF({ ...f, [k]: (e.target as HTMLInputElement).value });
  const events = page?.events || [];
  return (
    <main>
      <h2>Audit log</h2>
      <form class="filters" aria-label="Filters" onSubmit={(e) => { e.preventDefault(); setPages([""]); setApplied(f); }}>
        <label>Actor (key ID){" "}<input name="keyId" value={f.keyId} onInput={set("keyId")} /></label>
        <label>Action (method){" "}<input name="method" value={f.method} onInput={set("method")} placeholder="e.g. CreateSandbox" /></label>
        <label>Result{" "}
          <select name="result" value={f.result} onChange={set("result")}>
            <option value="">any</option>
            {["OK", "INVALID_ARGUMENT", "NOT_FOUND", "PERMISSION_DENIED", "UNAUTHENTICATED", "FAILED_PRECONDITION", "RESOURCE_EXHAUSTED", "ABORTED", "INTERNAL", "UNAVAILABLE"].map((r) => <option key={r} value={r}>{r}</option>)}
          </select>
        </label>
        <label>From{" "}<input type="datetime-local" name="start" value={f.start} onInput={set("start")} /></label>
        <label>To{" "}<input type="datetime-local" name="end" value={f.end} onInput={set("end")} /></label>
        <button type="submit">Apply</button>
      </form>
      <Err msg={err} />
      {page && events.length === 0 && <p class="muted">No event matches.</p>}
      {events.length > 0 && (
        <div class="scroll"><table data-testid="audit-list">
          <thead><tr><th scope="col">Time</th><th scope="col">Actor</th><th scope="col">Action</th><th scope="col">Result</th><th scope="col">Target</th><th scope="col">Source</th></tr></thead>
          <tbody>{events.map((ev) => (
            <tr key={ev.eventId}>
              <td>{when(ev.time)}</td>
              <td><code>{ev.keyId || "–"}</code>{ev.actorOrgId && <span class="muted"> ({ev.actorOrgId})</span>}</td>
              <td title={ev.method}>{ev.kind || ev.method}</td>
              <td>{ev.result === "OK" ? <span class="badge st-running">OK</span> : <span class="badge st-failed" title={`${ev.result}: ${ev.message || ""}`}>{ev.reason || ev.result}</span>}</td>
              <td>{ev.targetType ? `${ev.targetType} ${ev.targetId || ""}` : "–"}</td>
              <td>{ev.sourceAddress || "–"}</td>
            </tr>))}
          </tbody>
        </table></div>
      )}
      <p>
        {pages.length > 1 && <button onClick={() => setPages(pages.slice(0, -1))}>Previous page</button>}{" "}
        {page?.nextPageToken && <button onClick={() => setPages([...pages, page.nextPageToken!])}>Next page</button>}
      </p>
    </main>
  );
}

type ImagePrepull = { image: string; organizationId?: string; templateId?: string; state?: string; nodesPresent?: number; nodesTotal?: number; lastError?: string; lastAttemptTime?: string; nextAttemptTime?: string };
type PrepullStatus = { images?: ImagePrepull[]; leftOut?: number; hidden?: number; reportTime?: string };
type ManagedRunner = { runnerId: string; displayName?: string; runnerGroupId?: string; zone?: string; releaseChannel?: string; policy?: unknown; policyRevision?: string; etag?: string; updateTime?: string; status?: { prepull?: PrepullStatus } };

// Prepull shows a runner's image pre-pull of the templates it may place, as its last
// heartbeat reported it (ManagedRunnerStatus.prepull); nothing when it reports none.
function Prepull({ runnerId, p }: { runnerId: string; p?: PrepullStatus }) {
  if (!p) return null;
  const imgs = p.images || [];
  const st = (s?: string) => lower(s, "PREPULL_");
  return (
    <>
      <h4 id={`prepull-${runnerId}`}>Image pre-pull</h4>
      <p class="muted">
        {imgs.length} image(s){p.leftOut ? `, ${p.leftOut} more not listed` : ""}{p.hidden ? `, ${p.hidden} of other organizations not shown` : ""}; reported {when(p.reportTime)}
      </p>
      {imgs.length > 0 && (
        <div class="scroll">
          <table aria-labelledby={`prepull-${runnerId}`} data-testid="runner-prepull">
            <thead><tr><th scope="col">Image</th><th scope="col">State</th><th scope="col">Template</th><th scope="col">Nodes</th><th scope="col">Last error</th><th scope="col">Last attempt</th><th scope="col">Next attempt</th></tr></thead>
            <tbody>
              {imgs.map((i) => (
                <tr key={i.image}>
                  <th scope="row"><code>{i.image}</code></th>
                  <td><span class={`badge ${i.state === "PREPULL_FAILED" ? "st-failed" : i.state === "PREPULL_PRESENT" ? "st-running" : "st-pending"}`}>{st(i.state)}</span></td>
                  <td>{i.templateId ? `${i.organizationId || ""}/${i.templateId}` : "–"}</td>
                  <td>{i.nodesTotal ? `${i.nodesPresent || 0} of ${i.nodesTotal}` : "–"}</td>
                  <td class="error">{i.lastError || ""}</td>
                  <td>{when(i.lastAttemptTime)}</td>
                  <td>{when(i.nextAttemptTime)}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </>
  );
}

// PolicyEditor shows a runner's policy and edits it: the whole document replaced
// (UpdateManagedRunner, update mask `policy`) at the etag it was read at, so a change made
// meanwhile is refused (ABORTED, CWSANDBOX_ETAG_MISMATCH) rather than overwritten. The
// API's refusal is shown as the other editors show theirs (FailureView): its message and
// reason, each field violation, and on a conflict a reload.
function PolicyEditor({ runner, onSaved }: { runner: ManagedRunner; onSaved: () => void }) {
  const [draft, setDraft] = useState<{ text: string; etag: string } | null>(null);
  const [f, setF] = useState<Failure>(noFailure);
  const [busy, setBusy] = useState(false);
  const [saved, setSaved] = useState("");
  const shown = JSON.stringify(runner.policy ?? null, null, 2);
  const edit = async () => {
    setF(noFailure); setSaved("");
    try {
      const r = await api<ManagedRunner>("GET", `sandbox/managedRunners/${encodeURIComponent(runner.runnerId)}`);
      setDraft({ text: JSON.stringify(r.policy ?? {}, null, 2), etag: r.etag || "" });
    } catch (e) {
      setF(failure(e));
    }
  };
  const save = async (e: Event) => {
    e.preventDefault();
    setF(noFailure);
    let policy: unknown;
    try {
      policy = JSON.parse(draft!.text);
    } catch (x) {
      setF({ ...noFailure, msg: `The policy is not JSON: ${(x as Error).message}` });
      return;
    }
    setBusy(true);
    try {
      const r = await api<ManagedRunner>("PATCH", `sandbox/managedRunners/${encodeURIComponent(runner.runnerId)}?updateMask=policy`, { policy, etag: draft!.etag });
      setDraft(null);
      setSaved(`Saved: policy revision ${r.policyRevision || "?"}.`);
      onSaved();
    } catch (x) {
      setF(failure(x));
    } finally {
      setBusy(false);
    }
  };
  if (!draft) {
    return (
      <>
        <pre class="json" data-testid="policy">{shown}</pre>
        <button onClick={edit}>Edit policy</button> <span class="muted" role="status">{saved}</span>
        <FailureView f={f} what="runner" />
      </>
    );
  }
  const id = `policy-${runner.runnerId}`;
  const failed = f.msg !== "";
  return (
    <form onSubmit={save} aria-label={`Policy of ${runner.runnerId}`} class="edit-form" data-testid="policy-editor">
      <label for={id}>Policy (JSON; replaces the whole document)</label>
      <textarea id={id} name="policy" rows={16} spellcheck={false} value={draft.text}
        aria-invalid={failed ? "true" : undefined} aria-describedby={failed ? `${id}-err` : undefined}
        onInput={(e) => setDraft({ ...draft, text: (e.target as HTMLTextAreaElement).value })} />
      <div id={`${id}-err`} aria-live="polite">
        <FailureView f={f} what="runner" onReload={edit} />
      </div>
      <div>
        <button type="submit" disabled={busy}>Save</button>{" "}
        <button type="button" onClick={() => { setDraft(null); setF(noFailure); }}>Cancel</button>
      </div>
    </form>
  );
}

// Runners shows the organization's managed runners and their policies
// (RunnerManagementService: admin keys only); admins edit a policy.
export function Runners() {
  const [runners, err, reload] = useLoad(() => api<{ managedRunners?: ManagedRunner[] }>("GET", "sandbox/managedRunners?pageSize=1000").then((r) => r.managedRunners || []), [], 10000);
  return (
    <main>
      <h2>Runners and policies</h2>
      <Err msg={err} />
      {runners && runners.length === 0 && <p class="muted">No managed runner.</p>}
      {(runners || []).map((r) => (
        <section key={r.runnerId} aria-labelledby={`runner-${r.runnerId}`} data-testid="runner-policy">
          <h3 id={`runner-${r.runnerId}`}>{r.runnerId} {r.displayName && <span class="muted">{r.displayName}</span>}</h3>
          <dl class="facts">
            <dt>Group</dt><dd>{r.runnerGroupId || "default"}</dd>
            <dt>Zone</dt><dd>{r.zone || "–"}</dd>
            <dt>Release channel</dt><dd>{lower(r.releaseChannel, "RELEASE_CHANNEL_")}</dd>
            <dt>Policy revision</dt><dd>{r.policyRevision || "0"}</dd>
            <dt>Updated</dt><dd>{when(r.updateTime)}</dd>
          </dl>
          <h4>Policy</h4>
          <PolicyEditor runner={r} onSaved={reload} />
          <Prepull runnerId={r.runnerId} p={r.status?.prepull} />
          <JSONDetails v={r.status} summary="Status" />
        </section>
      ))}
    </main>
  );
}
