import { useEffect, useState } from "preact/hooks";
import { api, errText, fromBase64, toBase64, upload } from "./api";
import { Err, iso, when } from "./ui";

// MaxUpload bounds an upload: WriteFile's JSON body (the file in base64, 4/3 of its size)
// must fit the console's proxy bound (1 MiB).
export const MaxUpload = 512 << 10;

// MaxEntries bounds the entries a listing shows (the sandbox says what they are).
const MaxEntries = 2000;

type Entry = { name: string; kind: string; size: number; mtime: number };

const dirOf = (d: string) => (d.endsWith("/") ? d : d + "/");

// parent is the directory above d ("/" stays "/").
function parent(d: string): string {
  const t = d.replace(/\/+$/, "");
  const i = t.lastIndexOf("/");
  return i <= 0 ? "/" : t.slice(0, i);
}

// listDir lists d in the sandbox with Exec (find and stat: the image's own tools; the path
// is an argument, never shell text). A trailing slash follows a symbolic link to a
// directory. Entries whose names hold a newline are shown cut at it.
async function listDir(id: string, d: string): Promise<{ entries: Entry[]; warning: string; truncated: boolean }> {
  const r = await api<{ stdout?: string; stderr?: string; exitCode?: number; stdoutTruncated?: boolean }>("POST", `sandboxes/${encodeURIComponent(id)}:exec`, {
    command: ["find", dirOf(d), "-mindepth", "1", "-maxdepth", "1", "-exec", "stat", "-c", "%F|%s|%Y|%n", "{}", "+"],
    maxOutputBytes: 1 << 20,
  });
  const dec = new TextDecoder();
  const out = dec.decode(fromBase64(r.stdout));
  const stderr = dec.decode(fromBase64(r.stderr)).slice(0, 1000);
  const entries: Entry[] = [];
  for (const line of out.split("\n")) {
    const m = line.match(/^([^|]*)\|(\d+)\|(\d+)\|(.*)$/);
    if (!m) continue;
    const name = m[4].slice(m[4].lastIndexOf("/") + 1);
    if (name) entries.push({ kind: m[1], size: Number(m[2]), mtime: Number(m[3]), name });
  }
  if ((r.exitCode || 0) !== 0 && entries.length === 0) throw new Error(stderr.trim() || `listing ${d} failed (exit code ${r.exitCode})`);
  const isDir = (e: Entry) => e.kind === "directory" || e.kind === "symbolic link";
  entries.sort((a, b) => Number(isDir(b)) - Number(isDir(a)) || a.name.localeCompare(b.name));
  return { entries: entries.slice(0, MaxEntries), warning: (r.exitCode || 0) !== 0 ? stderr : "", truncated: !!r.stdoutTruncated || entries.length > MaxEntries };
}

const size = (n: number) => (n < 1024 ? `${n} B` : n < 1 << 20 ? `${(n / 1024).toFixed(1)} KiB` : `${(n / (1 << 20)).toFixed(1)} MiB`);

// Files browses the sandbox's (primary container's) files: a directory's entries, a
// file's download (ReadFile) and an upload into the directory (WriteFile).
export function Files({ id }: { id: string }) {
  const [dir, setDir] = useState("/");
  const [typed, setTyped] = useState("/");
  const [list, setList] = useState<{ entries: Entry[]; warning: string; truncated: boolean }>();
  const [err, setErr] = useState("");
  const [status, setStatus] = useState("");
  const [progress, setProgress] = useState<[number, number] | null>(null);
  const [gen, setGen] = useState(0);
  useEffect(() => {
    let live = true;
    setErr("");
    listDir(id, dir).then((l) => live && setList(l), (e) => { if (live) { setList(undefined); setErr(errText(e)); } });
    return () => { live = false; };
  }, [id, dir, gen]);
  const open = (d: string) => { setDir(d); setTyped(d); setStatus(""); };
  const path = (name: string) => dirOf(dir) + name;
  const download = async (name: string) => {
    setStatus(`downloading ${name}…`);
    try {
      const r = await api<{ content?: string }>("GET", `sandboxes/${encodeURIComponent(id)}:readFile?path=${encodeURIComponent(path(name))}`);
      const bytes = fromBase64(r.content);
      const url = URL.createObjectURL(new Blob([bytes], { type: "application/octet-stream" }));
      const a = document.createElement("a");
      a.href = url;
      a.download = name;
      document.body.appendChild(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
      setStatus(`downloaded ${name} (${size(bytes.length)})`);
    } catch (e) {
      setStatus("");
      setErr(errText(e));
    }
  };
  const send = async (e: Event) => {
    e.preventDefault();
    const input = (e.target as HTMLFormElement).elements.namedItem("file") as HTMLInputElement;
    const f = input.files?.[0];
    setErr("");
    if (!f) return setErr("Choose a file first.");
    if (f.size > MaxUpload) return setErr(`${f.name} is ${size(f.size)}; the console uploads at most ${size(MaxUpload)} (use the API or sbx for larger files).`);
    if (f.name.includes("/") || f.name === "." || f.name === "..") return setErr(`"${f.name}" is not a file name.`);
    setStatus(`uploading ${f.name}…`);
    setProgress([0, f.size]);
    try {
      const content = toBase64(new Uint8Array(await f.arrayBuffer()));
      await upload(`sandboxes/${encodeURIComponent(id)}:writeFile`, { path: path(f.name), content }, (s, t) => setProgress([s, t]));
      setStatus(`uploaded ${f.name} (${size(f.size)}) to ${path(f.name)}`);
      input.value = "";
      setGen((g) => g + 1);
    } catch (x) {
      setStatus("");
      setErr(errText(x));
    } finally {
      setProgress(null);
    }
  };
  return (
    <section aria-labelledby="files-h" data-testid="files">
      <h3 id="files-h">Files</h3>
      <form class="filters" onSubmit={(e) => { e.preventDefault(); open(typed.startsWith("/") ? typed : "/" + typed); }}>
        <label>Directory{" "}
          <input name="dir" value={typed} onInput={(e) => setTyped((e.target as HTMLInputElement).value)} />
        </label>
        <button type="submit">Open</button>
        <button type="button" onClick={() => open(parent(dir))} disabled={dir === "/"}>Up</button>
      </form>
      <Err msg={err} />
      <p class="muted" role="status" data-testid="files-status">{status}</p>
      {progress && <progress max={progress[1] || 1} value={progress[0]} aria-label="Upload progress" />}
      {list?.warning && <p class="muted">Some entries could not be read: {list.warning}</p>}
      {list?.truncated && <p class="muted">The listing was cut (too many entries: at most {MaxEntries}, and 1 MiB of listing, are shown).</p>}
      {list && list.entries.length === 0 && <p class="muted">{dir} is empty.</p>}
      {list && list.entries.length > 0 && (
        <div class="scroll files"><table data-testid="file-list">
          <thead><tr><th scope="col">Name</th><th scope="col">Kind</th><th scope="col">Size</th><th scope="col">Modified</th><th scope="col"><span class="sr">Action</span></th></tr></thead>
          <tbody>{list.entries.map((e) => (
            <tr key={e.name}>
              <td>{e.kind === "directory" || e.kind === "symbolic link"
                ? <a href="#" onClick={(ev) => { ev.preventDefault(); open(path(e.name)); }}>{e.name}{e.kind === "directory" ? "/" : ""}</a>
                : e.name}</td>
              <td>{e.kind}</td>
              <td>{e.kind === "directory" ? "–" : size(e.size)}</td>
              <td>{when(iso(new Date(e.mtime * 1000)))}</td>
              <td>{e.kind !== "directory" && <button onClick={() => download(e.name)} aria-label={`Download ${e.name}`}>Download</button>}</td>
            </tr>))}
          </tbody>
        </table></div>
      )}
      <form class="filters" onSubmit={send} aria-label="Upload">
        <label>Upload to {dir}{" "}<input type="file" name="file" /></label>
        <button type="submit" disabled={!!progress}>Upload</button>
        <span class="muted">at most {size(MaxUpload)}; a file of that name is replaced</span>
      </form>
    </section>
  );
}
