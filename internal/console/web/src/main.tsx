import { render } from "preact";
import { useEffect, useState } from "preact/hooks";
import "@xterm/xterm/css/xterm.css";
import "./style.css";
import { api, errText, listSandboxes, responseError, Runner, Sandbox, signIn, signOut, stateName, states, whoAmI, Who } from "./api";
import { SandboxTerminal } from "./terminal";
import { Files } from "./files";
import { Quotas, SandboxSnapshots } from "./edit";
import { ApiKeys, Audit, Runners, Snapshots, Templates, Volumes } from "./pages";
import { Err, useLoad, when } from "./ui";

function useHash(): string {
  const [h, setH] = useState(location.hash || "#/");
  useEffect(() => {
    const on = () => setH(location.hash || "#/");
    addEventListener("hashchange", on);
    return () => removeEventListener("hashchange", on);
  }, []);
  return h;
}

function SignIn({ onIn }: { onIn: (w: Who) => void }) {
  const [key, setKey] = useState("");
  const [err, setErr] = useState("");
  const [busy, setBusy] = useState(false);
  const submit = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    setErr("");
    try {
      onIn(await signIn(key.trim()));
    } catch (x) {
      setErr(errText(x));
    } finally {
      setBusy(false);
    }
  };
  return (
    <main class="signin">
      <h1>sandboxd console</h1>
      <form onSubmit={submit}>
        <label for="apikey">API key</label>
        <input id="apikey" name="apikey" type="password" autocomplete="off" required value={key}
          onInput={(e) => setKey((e.target as HTMLInputElement).value)} autofocus />
        <button type="submit" disabled={busy}>Sign in</button>
        <Err msg={err} />
        <p class="muted">The key stays on the server for this session; the browser only keeps a session cookie.</p>
      </form>
    </main>
  );
}

function StateBadge({ s }: { s?: string }) {
  const n = stateName(s);
  return <span class={`badge st-${n}`}>{n}</span>;
}

const gib = (b?: string) => (b ? (Number(b) / 2 ** 30).toFixed(1) + " GiB" : "–");
const cores = (m?: string) => (m ? (Number(m) / 1000).toFixed(1) : "–");

function Overview() {
  const [sbs, err] = useLoad(() => listSandboxes({ all: true }), []);
  const [runners, rerr] = useLoad(() => api<{ runners?: Runner[] }>("GET", "availableRunners").then((r) => r.runners || []), [], 10000);
  const counts: Record<string, number> = {};
  for (const s of sbs || []) counts[stateName(s.status?.state)] = (counts[stateName(s.status?.state)] || 0) + 1;
  const failed = (sbs || []).filter((s) => s.status?.state === "STATE_FAILED").slice(0, 10);
  return (
    <main>
      <h2>Overview</h2>
      <section aria-labelledby="by-state">
        <h3 id="by-state">Sandboxes by state</h3>
        <Err msg={err} />
        <ul class="cards">
          {states.map((s) => (
            <li key={s}><a href={`#/sandboxes?state=${s}`}><span class="num">{counts[stateName(s)] || 0}</span> {stateName(s)}</a></li>
          ))}
        </ul>
      </section>
      <section aria-labelledby="runners-h">
        <h3 id="runners-h">Runners</h3>
        <Err msg={rerr} />
        {runners && runners.length === 0 && <p class="muted">No runner is visible to this key.</p>}
        {runners && runners.length > 0 && (
          <div class="scroll"><table>
            <thead><tr><th scope="col">Runner</th><th scope="col">Status</th><th scope="col">Sandboxes</th><th scope="col">CPU free / max</th><th scope="col">Memory free / max</th><th scope="col">Tags</th></tr></thead>
            <tbody>{runners.map((r) => (
              <tr key={r.runnerId}>
                <td>{r.runnerId}</td>
                <td>{r.healthy ? <span class="badge st-running">healthy</span> : <span class="badge st-failed">unhealthy</span>}</td>
                <td>{r.resources?.runningSandboxes ?? 0}</td>
                <td>{cores(r.resources?.availableCpuMillicores)} / {cores(r.capabilities?.maxCpuMillicores)}</td>
                <td>{gib(r.resources?.availableMemoryBytes)} / {gib(r.capabilities?.maxMemoryBytes)}</td>
                <td>{(r.tags || []).join(", ")}</td>
              </tr>))}
            </tbody>
          </table></div>
        )}
      </section>
      <section aria-labelledby="fail-h">
        <h3 id="fail-h">Recent failures</h3>
        {failed.length === 0 ? <p class="muted">None.</p> : (
          <ul>{failed.map((s) => <li key={s.sandboxId}><a href={`#/sandboxes/${s.sandboxId}`}>{s.sandboxId}</a>: {s.status?.stateReason || "no reason given"}</li>)}</ul>
        )}
      </section>
    </main>
  );
}

function SandboxList({ query }: { query: URLSearchParams }) {
  const [state, setState] = useState(query.get("state") || "");
  const [tag, setTag] = useState(query.get("tag") || "");
  const [runner, setRunner] = useState(query.get("runner") || "");
  const [sbs, err] = useLoad(() => listSandboxes({ state, tag, runner }), [state, tag, runner]);
  return (
    <main>
      <h2>Sandboxes</h2>
      <form class="filters" onSubmit={(e) => e.preventDefault()} aria-label="Filters">
        <label>State{" "}
          <select value={state} onChange={(e) => setState((e.target as HTMLSelectElement).value)}>
            <option value="">live (any)</option>
            {states.map((s) => <option key={s} value={s}>{stateName(s)}</option>)}
          </select>
        </label>
        <label>Tag{" "}
          <input value={tag} onChange={(e) => setTag((e.target as HTMLInputElement).value)} placeholder="e.g. team-a" />
        </label>
        <label>Runner{" "}
          <input value={runner} onChange={(e) => setRunner((e.target as HTMLInputElement).value)} placeholder="runner ID" />
        </label>
      </form>
      <Err msg={err} />
      {sbs && sbs.length === 0 && <p class="muted">No sandbox matches.</p>}
      {sbs && sbs.length > 0 && (
        <div class="scroll"><table data-testid="sandbox-list">
          <thead><tr><th scope="col">Sandbox</th><th scope="col">State</th><th scope="col">Image</th><th scope="col">Tags</th><th scope="col">Runner</th><th scope="col">Created</th></tr></thead>
          <tbody>{sbs.map((s) => (
            <tr key={s.sandboxId}>
              <td><a href={`#/sandboxes/${s.sandboxId}`}>{s.displayName || s.sandboxId}</a></td>
              <td><StateBadge s={s.status?.state} /></td>
              <td>{s.spec?.containers?.[0]?.image}</td>
              <td>{(s.spec?.tags || []).join(", ")}</td>
              <td>{s.status?.runnerId}</td>
              <td>{when(s.status?.createTime)}</td>
            </tr>))}
          </tbody>
        </table></div>
      )}
    </main>
  );
}

function Logs({ id }: { id: string }) {
  const [text, setText] = useState("");
  const [err, setErr] = useState("");
  useEffect(() => {
    const ac = new AbortController();
    setText("");
    (async () => {
      const res = await fetch(`api/sandboxes/${encodeURIComponent(id)}/logs`, { signal: ac.signal, credentials: "same-origin" });
      if (!res.ok || !res.body) {
        setErr(errText(await responseError(res)));
        return;
      }
      const rd = res.body.getReader();
      const dec = new TextDecoder();
      for (;;) {
        const { value, done } = await rd.read();
        if (done) break;
        const chunk = dec.decode(value, { stream: true });
        setText((t) => (t + chunk).slice(-200000));
      }
    })().catch((e) => { if (!ac.signal.aborted) setErr(String(e)); });
    return () => ac.abort();
  }, [id]);
  return (
    <section aria-labelledby="logs-h">
      <h3 id="logs-h">Logs</h3>
      <Err msg={err} />
      <pre class="logs" data-testid="logs" tabIndex={0} aria-live="off">{text || "(no output yet)"}</pre>
    </section>
  );
}

function SandboxDetail({ id }: { id: string }) {
  const [sb, err] = useLoad(() => api<Sandbox>("GET", `sandboxes/${encodeURIComponent(id)}`), [id]);
  const [actErr, setActErr] = useState("");
  const [confirming, setConfirming] = useState(false);
  const live = sb && !["STATE_TERMINATED", "STATE_COMPLETED", "STATE_FAILED", "STATE_TERMINATING"].includes(sb.status?.state || "");
  const del = async () => {
    try {
      await api("DELETE", `sandboxes/${encodeURIComponent(id)}`);
      setConfirming(false);
    } catch (e) {
      setActErr(errText(e));
    }
  };
  return (
    <main>
      <p><a href="#/sandboxes">← Sandboxes</a></p>
      <h2>Sandbox <code>{id}</code> {sb && <StateBadge s={sb.status?.state} />}</h2>
      <Err msg={err} />
      {sb && (
        <>
          <div class="actions">
            {!confirming && <button class="danger" onClick={() => setConfirming(true)} disabled={!live}>Stop and delete…</button>}
            {confirming && (
              <div role="alertdialog" aria-labelledby="confirm-h" class="confirm">
                <p id="confirm-h">Stop and delete sandbox {id}? Its processes are killed and its files are gone.</p>
                <button class="danger" onClick={del} autofocus>Delete</button>{" "}
                <button onClick={() => setConfirming(false)}>Cancel</button>
              </div>
            )}
            <Err msg={actErr} />
          </div>
          <dl class="facts">
            <dt>State reason</dt><dd>{sb.status?.stateReason || "–"}</dd>
            <dt>Runner</dt><dd>{sb.status?.runnerId || "–"}</dd>
            <dt>Runtime class</dt><dd>{sb.status?.effectiveRuntimeClass || sb.spec?.runtimeClass || "–"}</dd>
            <dt>Tags</dt><dd>{(sb.spec?.tags || []).join(", ") || "–"}</dd>
            <dt>Created</dt><dd>{when(sb.status?.createTime)}</dd>
            <dt>Started</dt><dd>{when(sb.status?.startTime)}</dd>
          </dl>
          <section aria-labelledby="ctr-h">
            <h3 id="ctr-h">Containers</h3>
            <div class="scroll"><table>
              <thead><tr><th scope="col">Name</th><th scope="col">Image</th><th scope="col">Command</th><th scope="col">State</th><th scope="col">Restarts</th></tr></thead>
              <tbody>{(sb.spec?.containers || []).map((c) => {
                const st = sb.status?.containerStatuses?.find((x) => x.name === c.name);
                return (<tr key={c.name}><td>{c.name}</td><td>{c.image}</td><td><code>{[c.command, ...(c.args || [])].filter(Boolean).join(" ")}</code></td>
                  <td><StateBadge s={st?.state} /></td><td>{st?.restartCount ?? 0}</td></tr>);
              })}</tbody>
            </table></div>
          </section>
          {(sb.status?.services || []).length > 0 && (
            <section aria-labelledby="ep-h">
              <h3 id="ep-h">Endpoints</h3>
              <ul>{sb.status!.services!.map((s) => (
                <li key={s.name || s.port}>{s.name || s.port}: {s.url ? <a href={s.url} target="_blank" rel="noopener noreferrer">{s.url}</a> : "no URL"}</li>
              ))}</ul>
            </section>
          )}
          <Logs id={id} />
          {sb.status?.state === "STATE_RUNNING" && <SandboxTerminal id={id} />}
          {sb.status?.state === "STATE_RUNNING" && <Files id={id} />}
          <SandboxSnapshots sb={sb} />
        </>
      )}
    </main>
  );
}

function App() {
  const [who, setWho] = useState<Who | null | undefined>(undefined);
  const hash = useHash();
  useEffect(() => { whoAmI().then(setWho, () => setWho(null)); }, []);
  if (who === undefined) return <p class="muted">Loading…</p>;
  if (who === null) return <SignIn onIn={setWho} />;
  const [path, qs] = hash.slice(1).split("?");
  const query = new URLSearchParams(qs || "");
  let page;
  let m;
  if ((m = path.match(/^\/sandboxes\/([^/]+)$/))) page = <SandboxDetail id={decodeURIComponent(m[1])} key={m[1]} />;
  else if (path === "/sandboxes") page = <SandboxList query={query} key={qs} />;
  else if (path === "/templates") page = <Templates />;
  else if (path === "/volumes") page = <Volumes />;
  else if (path === "/snapshots") page = <Snapshots />;
  else if (path === "/apikeys") page = <ApiKeys who={who} />;
  else if (path === "/audit") page = <Audit />;
  else if (path === "/runners") page = <Runners />;
  else if (path === "/quotas") page = <Quotas org={who.organization} admin={who.role === "SANDBOX_ADMIN"} key={who.keyId} />;
  else page = <Overview />;
  const out = async () => { await signOut(); setWho(null); };
  return (
    <>
      <a class="skip" href="#content" onClick={(e) => { e.preventDefault(); document.getElementById("content")?.focus(); }}>Skip to content</a>
      <header>
        <strong>sandboxd</strong>
        <nav aria-label="Main">
          <a href="#/" aria-current={path === "/" || path === "" ? "page" : undefined}>Overview</a>
          <a href="#/sandboxes" aria-current={path.startsWith("/sandboxes") ? "page" : undefined}>Sandboxes</a>
          {[["/templates", "Templates"], ["/volumes", "Volumes"], ["/snapshots", "Snapshots"], ["/apikeys", "API keys"], ["/quotas", "Quotas"], ["/runners", "Runners"], ["/audit", "Audit"]].map(([p, n]) => (
            <a key={p} href={"#" + p} aria-current={path === p ? "page" : undefined}>{n}</a>
          ))}
        </nav>
        <span class="who" data-testid="who">{who.organization} · {who.role.replace("SANDBOX_", "").toLowerCase()} · key {who.keyId}</span>
        <button onClick={out}>Sign out</button>
      </header>
      <div id="content" tabIndex={-1}>{page}</div>
    </>
  );
}

render(<App />, document.getElementById("app")!);
