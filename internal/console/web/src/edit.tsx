// The console's editors: a template (UpdateSandboxTemplate, at the revision it was read
// at), a volume (UpdateVolume: its description, and a grow), an organization's quota
// (GetQuotaUsage, GetQuota; SetQuota for the platform's admins) and a sandbox's
// file-system snapshots (CreateFileSystemSnapshot). Each calls the REST API through the
// console's proxy with the session's key, like every page, and shows the API's refusal
// (message, reason, field violations) as it came. Server data is rendered as text only.
import { useEffect, useState } from "preact/hooks";
import { api, Sandbox } from "./api";
import { Err, failure, Failure, FailureView, newRequestID, noFailure, useLoad, when } from "./ui";

const enc = encodeURIComponent;

// sameJSON says whether two JSON values are equal as documents (key order aside).
function canon(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(canon);
  if (v && typeof v === "object") {
    const o: Record<string, unknown> = {};
    for (const k of Object.keys(v as object).sort()) o[k] = canon((v as Record<string, unknown>)[k]);
    return o;
  }
  return v;
}
const sameJSON = (a: unknown, b: unknown) => JSON.stringify(canon(a)) === JSON.stringify(canon(b));

// parseJSON parses a field's text: {} for an empty one, an error naming the field.
function parseJSON(field: string, text: string): [unknown, string] {
  if (!text.trim()) return [{}, ""];
  try {
    return [JSON.parse(text), ""];
  } catch (e) {
    return [undefined, `${field} is not JSON: ${(e as Error).message}`];
  }
}

export type Template = {
  sandboxTemplateId: string; displayName?: string; revision?: string; createTime?: string; updateTime?: string;
  spec?: { containers?: { image?: string }[] } & Record<string, unknown>; attachments?: Record<string, unknown>;
};

// TemplateEditor edits a template's name, spec and attachments. It reads the template
// again when opened; Save sends only the fields that changed (update_mask: displayName,
// spec, attachments; the whole spec and attachments replaced) with the revision it was
// read at, so a change made meanwhile is refused (ABORTED CWSANDBOX_ETAG_MISMATCH) rather
// than overwritten.
export function TemplateEditor({ id, onClose, onSaved }: { id: string; onClose: () => void; onSaved: (msg: string) => void }) {
  const [orig, setOrig] = useState<Template | null>(null);
  const [draft, setDraft] = useState({ name: "", spec: "", attachments: "" });
  const [f, setF] = useState<Failure>(noFailure);
  const [note, setNote] = useState("");
  const [busy, setBusy] = useState(false);
  const load = async () => {
    setF(noFailure); setNote("");
    try {
      const t = await api<Template>("GET", `sandboxTemplates/${enc(id)}`);
      setOrig(t);
      setDraft({ name: t.displayName || "", spec: JSON.stringify(t.spec ?? {}, null, 2), attachments: JSON.stringify(t.attachments ?? {}, null, 2) });
    } catch (e) {
      setF(failure(e));
    }
  };
  useEffect(() => { void load(); }, [id]);
  const save = async (e: Event) => {
    e.preventDefault();
    setF(noFailure); setNote("");
    const [spec, serr] = parseJSON("The spec", draft.spec);
    const [attachments, aerr] = parseJSON("The attachments", draft.attachments);
    if (serr || aerr) {
      setF({ ...noFailure, msg: serr || aerr });
      return;
    }
    const mask: string[] = [];
    if (draft.name !== (orig!.displayName || "")) mask.push("displayName");
    if (!sameJSON(spec, orig!.spec ?? {})) mask.push("spec");
    if (!sameJSON(attachments, orig!.attachments ?? {})) mask.push("attachments");
    if (mask.length === 0) {
      setNote("Nothing changed.");
      return;
    }
    setBusy(true);
    try {
      const t = await api<Template>("PATCH", `sandboxTemplates/${enc(orig!.sandboxTemplateId)}?updateMask=${mask.join(",")}`,
        { displayName: draft.name, spec, attachments, revision: orig!.revision || "0" });
      onSaved(`Saved ${t.displayName || t.sandboxTemplateId}: revision ${t.revision || "?"}.`);
    } catch (x) {
      setF(failure(x));
    } finally {
      setBusy(false);
    }
  };
  const fid = `tmpl-${id}`;
  return (
    <form onSubmit={save} class="edit-form" aria-label={`Edit template ${orig?.displayName || id}`} data-testid="template-editor">
      <h3>Edit template <code>{orig?.displayName || id}</code>{orig && <span class="muted"> revision {orig.revision || "0"}</span>}</h3>
      {orig && (
        <>
          <label for={`${fid}-name`}>Name</label>
          <input id={`${fid}-name`} name="displayName" value={draft.name} maxLength={128} required autofocus
            onInput={(e) => setDraft({ ...draft, name: (e.target as HTMLInputElement).value })} />
          <label for={`${fid}-spec`}>Spec (JSON, a PartialSandboxSpec; replaces the whole spec)</label>
          <textarea id={`${fid}-spec`} name="spec" rows={12} spellcheck={false} value={draft.spec}
            onInput={(e) => setDraft({ ...draft, spec: (e.target as HTMLTextAreaElement).value })} />
          <label for={`${fid}-att`}>Attachments (JSON object)</label>
          <textarea id={`${fid}-att`} name="attachments" rows={4} spellcheck={false} value={draft.attachments}
            onInput={(e) => setDraft({ ...draft, attachments: (e.target as HTMLTextAreaElement).value })} />
        </>
      )}
      <div aria-live="polite">
        <FailureView f={f} what="template" onReload={load} />
        {note && <p class="muted" role="status">{note}</p>}
      </div>
      <div>
        <button type="submit" disabled={busy || !orig}>Save</button>{" "}
        <button type="button" onClick={onClose}>Cancel</button>
      </div>
    </form>
  );
}

export type Volume = {
  volumeId: string; spec?: { description?: string; readOnly?: boolean; size?: string; pvc?: { runnerId?: string; claimName?: string } };
  status?: { state?: string; stateReason?: string; capacity?: string; attachedSandboxCount?: number };
};

// VolumeEditor edits what UpdateVolume changes: the description (update_mask
// spec.description) and the size (spec.size: a grow of a READY volume, checked against
// the organization's volume bytes quota). Volumes have no etag: the description saved
// replaces the current one; the server checks a grow against the current size.
export function VolumeEditor({ v, onClose, onSaved }: { v: Volume; onClose: () => void; onSaved: (msg: string) => void }) {
  const [desc, setDesc] = useState(v.spec?.description || "");
  const [size, setSize] = useState(v.spec?.size || v.status?.capacity || "");
  const [f, setF] = useState<Failure>(noFailure);
  const [note, setNote] = useState("");
  const [busy, setBusy] = useState(false);
  const save = async (e: Event) => {
    e.preventDefault();
    setF(noFailure); setNote("");
    const mask: string[] = [];
    if (desc !== (v.spec?.description || "")) mask.push("spec.description");
    if (size.trim() !== (v.spec?.size || v.status?.capacity || "")) mask.push("spec.size");
    if (mask.length === 0) {
      setNote("Nothing changed.");
      return;
    }
    setBusy(true);
    try {
      const r = await api<Volume>("PATCH", `volumes/${enc(v.volumeId)}?updateMask=${mask.join(",")}`, { spec: { description: desc, size: size.trim() } });
      onSaved(`Saved ${r.volumeId}: ${r.spec?.size || r.status?.capacity || "?"}, "${r.spec?.description || ""}".`);
    } catch (x) {
      setF(failure(x));
    } finally {
      setBusy(false);
    }
  };
  const fid = `vol-${v.volumeId}`;
  return (
    <form onSubmit={save} class="edit-form" aria-label={`Edit volume ${v.volumeId}`} data-testid="volume-editor">
      <h3>Edit volume <code>{v.volumeId}</code></h3>
      <label for={`${fid}-desc`}>Description</label>
      <input id={`${fid}-desc`} name="description" value={desc} maxLength={1024} autofocus onInput={(e) => setDesc((e.target as HTMLInputElement).value)} />
      <label for={`${fid}-size`}>Size (grow only, e.g. 20Gi; the volume must be ready)</label>
      <input id={`${fid}-size`} name="size" value={size} onInput={(e) => setSize((e.target as HTMLInputElement).value)} />
      <div aria-live="polite">
        <FailureView f={f} what="volume" />
        {note && <p class="muted" role="status">{note}</p>}
      </div>
      <div>
        <button type="submit" disabled={busy}>Save</button>{" "}
        <button type="button" onClick={onClose}>Cancel</button>
      </div>
    </form>
  );
}

// Quota limits as the API writes them: int64 as JSON strings; absent: unset (in limits:
// the default; in effective: unlimited); "-1": unlimited.
type Limits = { maxSandboxes?: string; maxCpuMillicores?: string; maxMemoryBytes?: string; maxVolumeBytes?: string; maxSnapshots?: string; maxSnapshotBytes?: string };
type Quota = { orgId?: string; limits?: Limits; effective?: Limits; updateTime?: string; updatedBy?: string };
type Usage = {
  orgId?: string; effective?: Limits; sandboxes?: string; cpuMillicores?: string; memoryBytes?: string;
  reservedSandboxes?: string; reservedCpuMillicores?: string; reservedMemoryBytes?: string;
  snapshots?: string; snapshotBytes?: string; maxSnapshots?: string; maxSnapshotBytes?: string; volumes?: string; volumeBytes?: string;
};

type Kind = "count" | "cpu" | "bytes";

const units: [string, number][] = [["Ki", 2 ** 10], ["Mi", 2 ** 20], ["Gi", 2 ** 30], ["Ti", 2 ** 40], ["Pi", 2 ** 50], ["k", 1e3], ["K", 1e3], ["M", 1e6], ["G", 1e9], ["T", 1e12]];

// show writes a quantity for people: CPU in cores, bytes in binary units.
function show(kind: Kind, v?: string): string {
  const n = Number(v || "0");
  if (kind === "cpu") return `${+(n / 1000).toFixed(3)}`;
  if (kind === "bytes") {
    for (const [u, m] of [["Ti", 2 ** 40], ["Gi", 2 ** 30], ["Mi", 2 ** 20], ["Ki", 2 ** 10]] as [string, number][]) {
      if (n >= m) return `${+(n / m).toFixed(2)} ${u}B`;
    }
    return `${n} B`;
  }
  return String(n);
}

// limitText is a limit in the form the quota form takes back: "" unset, "unlimited",
// cores, a binary quantity when exact, else a number.
function limitText(kind: Kind, v?: string): string {
  if (v === undefined) return "";
  if (v === "-1") return "unlimited";
  const n = Number(v);
  if (kind === "cpu") return n % 1000 === 0 ? String(n / 1000) : `${n}m`;
  if (kind === "bytes" && n > 0) {
    for (const [u, m] of [["Ti", 2 ** 40], ["Gi", 2 ** 30], ["Mi", 2 ** 20], ["Ki", 2 ** 10]] as [string, number][]) {
      if (n % m === 0) return `${n / m}${u}`;
    }
  }
  return v;
}

// parseLimit reads a quota form field: "" unset (the default), "unlimited" -1, a count,
// cores ("16", "0.5") or millicores ("500m"), bytes with a unit ("64Gi", "500M"). The API
// checks the number itself (a limit below -1 is its INVALID_ARGUMENT).
function parseLimit(kind: Kind, text: string): [string | undefined, string] {
  const s = text.trim();
  if (s === "") return [undefined, ""];
  if (s === "unlimited" || s === "-1") return ["-1", ""];
  if (/^-?\d+$/.test(s) && kind !== "cpu") return [String(BigInt(s)), ""];
  if (kind === "cpu") {
    let m = s.match(/^(-?\d+)m$/);
    if (m) return [m[1], ""];
    m = s.match(/^-?\d+(\.\d{1,3})?$/);
    if (m) return [String(Math.round(Number(s) * 1000)), ""];
    return [undefined, "cores (16, 0.5), millicores (500m), unlimited or empty"];
  }
  if (kind === "bytes") {
    const m = s.match(/^(\d+(?:\.\d+)?)\s*([KMGTP]i|[kKMGT])B?$/);
    if (m) {
      const mult = units.find(([u]) => u === m[2])![1];
      return [String(Math.round(Number(m[1]) * mult)), ""];
    }
    return [undefined, "bytes, with a unit (64Gi, 500Mi, 2T), unlimited or empty"];
  }
  return [undefined, "a whole number, unlimited or empty"];
}

const limitFields: [keyof Limits, string, Kind][] = [
  ["maxSandboxes", "Sandboxes", "count"], ["maxCpuMillicores", "CPU (cores)", "cpu"], ["maxMemoryBytes", "Memory", "bytes"],
  ["maxVolumeBytes", "Volume bytes", "bytes"], ["maxSnapshots", "Snapshots", "count"], ["maxSnapshotBytes", "Snapshot bytes", "bytes"],
];

// Quotas shows an organization's usage against its effective limits (GetQuotaUsage) and
// its limits as set (GetQuota): any key, its own organization; the platform's admins any
// organization. Admin keys get the form that sets the limits (SetQuota, which only the
// platform organization's admins may call: others are shown the API's refusal).
export function Quotas({ org, admin }: { org: string; admin: boolean }) {
  const [target, setTarget] = useState(org);
  const [shown, setShown] = useState(org);
  const own = shown === org;
  const [usage, uerr, reloadUsage] = useLoad(() => api<Usage>("GET", "quotaUsage" + (own ? "" : `?orgId=${enc(shown)}`)), [shown], 5000);
  const [quota, qerr, reloadQuota] = useLoad(() => api<Quota>("GET", `quotas/${enc(shown)}`), [shown], 15000);
  const eff = usage?.effective || {};
  const rows: [string, Kind, string | undefined, string | undefined, string][] = usage ? [
    ["Sandboxes", "count", usage.sandboxes, eff.maxSandboxes, usage.reservedSandboxes && usage.reservedSandboxes !== "0" ? `${usage.reservedSandboxes} being created` : ""],
    ["CPU (cores)", "cpu", usage.cpuMillicores, eff.maxCpuMillicores, usage.reservedCpuMillicores && usage.reservedCpuMillicores !== "0" ? `${show("cpu", usage.reservedCpuMillicores)} being created` : ""],
    ["Memory", "bytes", usage.memoryBytes, eff.maxMemoryBytes, usage.reservedMemoryBytes && usage.reservedMemoryBytes !== "0" ? `${show("bytes", usage.reservedMemoryBytes)} being created` : ""],
    ["Volume bytes", "bytes", usage.volumeBytes, eff.maxVolumeBytes, `${usage.volumes || "0"} volumes`],
    ["Snapshots", "count", usage.snapshots, usage.maxSnapshots ?? "0", ""],
    ["Snapshot bytes", "bytes", usage.snapshotBytes, usage.maxSnapshotBytes ?? "0", ""],
  ] : [];
  return (
    <main>
      <h2>Quotas and usage</h2>
      <form class="filters" aria-label="Organization" onSubmit={(e) => { e.preventDefault(); setShown(target.trim() || org); }}>
        <label>Organization{" "}<input name="org" value={target} maxLength={128} onInput={(e) => setTarget((e.target as HTMLInputElement).value)} /></label>
        <button type="submit">Show</button>
        <span class="muted">Other organizations: the platform's admins only.</span>
      </form>
      <Err msg={uerr} />
      {usage && !uerr && (usage.orgId || shown) === shown && (
        <div class="scroll"><table data-testid="quota-usage">
          <caption class="sr">Usage of {usage.orgId || shown} against its effective limits</caption>
          <thead><tr><th scope="col">Resource</th><th scope="col">Used</th><th scope="col">Limit</th><th scope="col">Share</th><th scope="col">Note</th></tr></thead>
          <tbody>{rows.map(([name, kind, used, limit, note]) => {
            const unlimited = limit === undefined || limit === "-1";
            const frac = unlimited ? 0 : Number(limit) === 0 ? 1 : Math.min(1, Number(used || "0") / Number(limit));
            return (
              <tr key={name} data-row={name}>
                <th scope="row">{name}</th>
                <td>{show(kind, used)}</td>
                <td>{unlimited ? "unlimited" : show(kind, limit)}</td>
                <td>{unlimited ? "–" : <><progress max={1} value={frac} aria-label={`${name}: ${Math.round(frac * 100)}% used`} /> {Math.round(frac * 100)}%</>}</td>
                <td>{note || ""}</td>
              </tr>
            );
          })}</tbody>
        </table></div>
      )}
      <Err msg={qerr} />
      {quota && !qerr && (quota.orgId || shown) === shown && (
        <p class="muted" data-testid="quota-set">
          {quota.updateTime ? `Limits last set ${when(quota.updateTime)} by key ${quota.updatedBy || "?"}.` : "No limit set: the gateway's defaults apply."}
        </p>
      )}
      {admin && quota && (quota.orgId || shown) === shown && <QuotaForm org={shown} quota={quota} onSaved={() => { reloadQuota(); reloadUsage(); }} key={shown} />}
    </main>
  );
}

function QuotaForm({ org, quota, onSaved }: { org: string; quota?: Quota; onSaved: () => void }) {
  const init = () => Object.fromEntries(limitFields.map(([k, , kind]) => [k, limitText(kind, quota?.limits?.[k])])) as Record<keyof Limits, string>;
  const [draft, setDraft] = useState(init);
  const [bad, setBad] = useState<Partial<Record<keyof Limits, string>>>({});
  const [f, setF] = useState<Failure>(noFailure);
  const [note, setNote] = useState("");
  const [busy, setBusy] = useState(false);
  const save = async (e: Event) => {
    e.preventDefault();
    setF(noFailure); setNote("");
    const limits: Limits = {};
    const errs: Partial<Record<keyof Limits, string>> = {};
    for (const [k, , kind] of limitFields) {
      const [v, err] = parseLimit(kind, draft[k]);
      if (err) errs[k] = err;
      else if (v !== undefined) limits[k] = v;
    }
    setBad(errs);
    if (Object.keys(errs).length > 0) return;
    setBusy(true);
    try {
      await api("PUT", `quotas/${enc(org)}`, { limits });
      setNote(`Saved the limits of ${org}.`);
      onSaved();
    } catch (x) {
      setF(failure(x));
    } finally {
      setBusy(false);
    }
  };
  return (
    <form onSubmit={save} class="edit-form" aria-label={`Set the limits of ${org}`} data-testid="quota-form">
      <h3>Set the limits of <code>{org}</code></h3>
      <p class="muted">Saving replaces every limit: an empty field takes the gateway's default; <code>unlimited</code> lifts a limit; 0 refuses every create.
        Only the platform organization's admins may set limits. Running sandboxes are never stopped by a lower limit.</p>
      <div class="limits">
        {limitFields.map(([k, label]) => (
          <label key={k}>
            <span>{label}</span>
            <input name={k} value={draft[k]} placeholder="default" aria-invalid={bad[k] ? "true" : undefined}
              aria-describedby={bad[k] ? `q-${k}-err` : undefined}
              onInput={(e) => setDraft({ ...draft, [k]: (e.target as HTMLInputElement).value })} />
            {bad[k] && <span class="error" id={`q-${k}-err`} role="alert">{bad[k]}</span>}
          </label>
        ))}
      </div>
      <div aria-live="polite">
        <FailureView f={f} what="quota" />
        {note && <p class="muted" role="status">{note}</p>}
      </div>
      <button type="submit" disabled={busy}>Save limits</button>
    </form>
  );
}

type Snapshot = { fileSystemSnapshotId: string; state?: string; stateReason?: string; sizeBytes?: string; sourceVolumeName?: string; createTime?: string };

// Snapshots takes a file-system snapshot of one of the sandbox's scratch volumes
// (CreateFileSystemSnapshot, with a fresh request_id) and lists the sandbox's snapshots.
export function SandboxSnapshots({ sb }: { sb: Sandbox }) {
  const id = sb.sandboxId;
  const scratch = (sb.spec?.volumes || []).filter((v) => !v.volumeId).map((v) => v.name);
  const [vol, setVol] = useState(scratch.includes("workspace") ? "workspace" : scratch[0] || "");
  const [f, setF] = useState<Failure>(noFailure);
  const [note, setNote] = useState("");
  const [busy, setBusy] = useState(false);
  // The list asks the runners about the snapshots still CREATING (the gateway does), so
  // one turns READY here as soon as it is.
  const [snaps, err, reload] = useLoad(async () => {
    const r = await api<{ fileSystemSnapshots?: Snapshot[] }>("GET", `fileSystemSnapshots?pageSize=100&sourceSandboxId=${enc(id)}`);
    return r.fileSystemSnapshots || [];
  }, [id], 3000);
  const take = async (e: Event) => {
    e.preventDefault();
    setF(noFailure); setNote("");
    setBusy(true);
    try {
      const s = await api<Snapshot>("POST", `sandboxes/${enc(id)}:snapshot`, { scratchVolumeName: vol, requestId: newRequestID() });
      setNote(`Snapshot ${s.fileSystemSnapshotId} of ${s.sourceVolumeName || vol}: ${(s.state || "").replace("SNAPSHOT_STATE_", "").toLowerCase()}.`);
      reload();
    } catch (x) {
      setF(failure(x));
    } finally {
      setBusy(false);
    }
  };
  return (
    <section aria-labelledby="snap-h" data-testid="sandbox-snapshots">
      <h3 id="snap-h">Snapshots</h3>
      {scratch.length === 0 ? <p class="muted">This sandbox has no scratch volume: a snapshot takes one (start the sandbox with one).</p> : (
        <form class="filters" onSubmit={take} aria-label="Take a snapshot">
          <label>Scratch volume{" "}
            <select name="scratchVolume" value={vol} onChange={(e) => setVol((e.target as HTMLSelectElement).value)}>
              {scratch.map((n) => <option key={n} value={n}>{n}</option>)}
            </select>
          </label>
          <button type="submit" disabled={busy}>Take snapshot</button>
        </form>
      )}
      <div aria-live="polite">
        <FailureView f={f} what="snapshot" />
        {note && <p class="muted" role="status" data-testid="snapshot-status">{note}</p>}
      </div>
      <Err msg={err} />
      {snaps && snaps.length > 0 && (
        <div class="scroll"><table data-testid="sandbox-snapshot-list">
          <thead><tr><th scope="col">Snapshot</th><th scope="col">Volume</th><th scope="col">State</th><th scope="col">Reason</th><th scope="col">Size</th><th scope="col">Created</th></tr></thead>
          <tbody>{snaps.map((s) => (
            <tr key={s.fileSystemSnapshotId}>
              <td><code>{s.fileSystemSnapshotId}</code></td>
              <td>{s.sourceVolumeName || "–"}</td>
              <td>{(s.state || "–").replace("SNAPSHOT_STATE_", "").toLowerCase()}</td>
              <td>{s.stateReason || "–"}</td>
              <td>{s.sizeBytes ? show("bytes", s.sizeBytes) : "–"}</td>
              <td>{when(s.createTime)}</td>
            </tr>))}
          </tbody>
        </table></div>
      )}
    </section>
  );
}
