// Package console tests the web console (internal/console) in a real headless Chromium
// (Debian's chromium package, driven with chromedp) against a real `sandboxd dev`.
// Without chromium the test skips, unless SANDBOXD_REQUIRE_CHROMIUM=1 (CI), where that is
// an error. SANDBOXD_CONSOLE_SCREENSHOTS=<dir> saves screenshots of the main pages there
// (docs/console/ holds the committed ones).
package console

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/sandboxd/sandboxd/internal/runtime/local/network"
	"github.com/sandboxd/sandboxd/internal/stack/stacktest"
	"github.com/sandboxd/sandboxd/internal/testenv"
)

// chromium finds the browser, or skips (fails under SANDBOXD_REQUIRE_CHROMIUM=1).
func chromium(t *testing.T) string {
	t.Helper()
	for _, n := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	if os.Getenv("SANDBOXD_REQUIRE_CHROMIUM") == "1" {
		t.Fatal("chromium is not installed (scripts/install-deps.sh --test) and SANDBOXD_REQUIRE_CHROMIUM=1")
	}
	t.Skip("chromium is not installed (scripts/install-deps.sh --test)")
	return ""
}

type dev struct {
	api, dataDir, bin string
	admin             string
}

// startDev builds sandboxd and starts `sandboxd dev` on free loopback ports with a
// bridge, subnet and cgroup parent of its own; it is stopped and cleaned at the end.
func startDev(t *testing.T) *dev {
	t.Helper()
	dir := t.TempDir()
	d := &dev{bin: filepath.Join(dir, "bin"), dataDir: filepath.Join(dir, "data")}
	if err := os.MkdirAll(d.bin, 0o755); err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(d.bin, "sandboxd"), "github.com/sandboxd/sandboxd/cmd/sandboxd")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build sandboxd: %v\n%s", err, out)
	}
	if _, err := testenv.Agent(d.bin); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	d.api = "http://" + addr
	pid := os.Getpid()
	bridge, cgroupParent := fmt.Sprintf("sbxcon%04x", pid&0xffff), fmt.Sprintf("sandboxd-console-%d", pid)
	subnet := netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.0/24", 200+pid%50, pid/50%256))
	logPath := filepath.Join(dir, "sandboxd.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(d.bin, "sandboxd"), "dev", "--data-dir", d.dataDir, "--listen", addr,
		"--edge-listen", "", "--data-plane-listen", "", "--metrics-listen", "", "--warm-pool", "0",
		"--bridge", bridge, "--subnet", subnet.String(), "--cgroup-parent", cgroupParent)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logf.Close()
		stacktest.ForceClean(d.dataDir)
		if m, err := network.New(network.Config{Bridge: bridge, Subnet: subnet, Table: "sandboxd_" + bridge,
			StateDir: filepath.Join(d.dataDir, "network")}); err == nil {
			_ = m.Cleanup()
		}
		parents, _ := filepath.Glob("/sys/fs/cgroup/*/" + cgroupParent)
		for _, p := range parents {
			_ = os.Remove(p)
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("sandboxd dev log (tail):\n%s", b[max(0, len(b)-4000):])
		}
	})
	deadline := time.Now().Add(90 * time.Second)
	for {
		res, err := http.Get(d.api + "/readyz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("sandboxd dev not ready after 90 s")
		}
		time.Sleep(200 * time.Millisecond)
	}
	b, err := os.ReadFile(filepath.Join(d.dataDir, "admin-api-key"))
	if err != nil {
		t.Fatal(err)
	}
	d.admin = strings.TrimSpace(string(b))
	return d
}

func (d *dev) newKey(t *testing.T, org string) string {
	t.Helper()
	return d.newKeyRole(t, org, "user")
}

func (d *dev) newKeyRole(t *testing.T, org, role string) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(d.bin, "sandboxd"), "apikey", "create", "--data-dir", d.dataDir, "--org", org, "--role", role).Output()
	if err != nil {
		t.Fatalf("apikey create: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func (d *dev) rest(t *testing.T, key, method, path string, body any) (int, []byte) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, d.api+path, r)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

// waitJS polls the JavaScript expression cond until it is true.
func waitJS(cond string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		for {
			ok, err := chromedp.Evaluate[bool](cond)(ctx, t)
			if err != nil {
				return err
			}
			if ok {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("waiting for %s: %w", cond, ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
}

// setInput sets a form field's value as typing would (the input and change events).
func setInput(sel, v string) chromedp.Action[chromedp.Void] {
	return waitJS(fmt.Sprintf(`((el) => { el.value = %q; el.dispatchEvent(new Event("input", {bubbles: true})); el.dispatchEvent(new Event("change", {bubbles: true})); return true })(document.querySelector(%q))`, v, sel))
}

// clickJS clicks the first element of sel whose text is text.
func clickJS(sel, text string) chromedp.Action[chromedp.Void] {
	return waitJS(fmt.Sprintf(`(() => { const e = [...document.querySelectorAll(%q)].find(e => e.textContent.trim() === %q); if (!e) return false; e.click(); return true })()`, sel, text))
}

// orDefault is p, or {} when it is empty.
func orDefault(p json.RawMessage) []byte {
	if len(p) == 0 || string(p) == "null" {
		return []byte("{}")
	}
	return p
}

// waitFile waits for path to hold want.
func waitFile(path string, want []byte) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		for {
			if b, err := os.ReadFile(path); err == nil && bytes.Equal(b, want) {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("waiting for %s: %w", path, ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
}

func textHas(sel, s string) string {
	return fmt.Sprintf(`(document.querySelector(%q)?.textContent || "").includes(%q)`, sel, s)
}

type css = chromedp.CSS

// TestConsoleInChromium signs in to the console with org A's key, sees a sandbox
// appear, opens its terminal and runs a command, reads its live logs and stops it; a key
// of org B sees none of it.
func TestConsoleInChromium(t *testing.T) {
	if testing.Short() {
		t.Skip("starts sandboxd dev and Chromium")
	}
	browser := chromium(t)
	testenv.RequireRoot(t, "sandboxd dev runs containers")
	d := startDev(t)
	keyA, keyB, adminA := d.newKey(t, "org-a"), d.newKey(t, "org-b"), d.newKeyRole(t, "org-a", "admin")
	shots := os.Getenv("SANDBOXD_CONSOLE_SCREENSHOTS")

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.NoSandbox,
		chromedp.WindowSize(1100, 760), chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelA()
	bctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	if err := chromedp.Do(bctx); err != nil { // starts the browser (with no timeout)
		t.Fatal(err)
	}
	ctx, cancelT := context.WithTimeout(bctx, 8*time.Minute)
	defer cancelT()
	shot := func(name string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			if shots == "" {
				return nil
			}
			b, err := chromedp.CaptureScreenshot()(ctx, t)
			if err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(shots, name+".png"), b, 0o644)
		})
	}
	signIn := func(key string) chromedp.Action[chromedp.Void] {
		return chromedp.Steps(
			chromedp.Navigate(d.api+"/console/"),
			chromedp.WaitVisible(css("#apikey")),
			chromedp.SendKeys(css("#apikey"), key),
			chromedp.Click(css(`button[type="submit"]`)),
			chromedp.WaitVisible(css(`[data-testid="who"]`)),
		)
	}
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if err := chromedp.Do(sctx, actions...); err != nil {
			dctx, cancel := context.WithTimeout(bctx, 10*time.Second)
			defer cancel()
			text, _ := chromedp.Run(dctx, chromedp.Evaluate[string](`document.body.innerText`))
			term, _ := chromedp.Run(dctx, chromedp.Evaluate[string](`document.querySelector(".xterm-rows")?.innerText || "(no terminal)"`))
			wide, _ := chromedp.Run(dctx, chromedp.Evaluate[string](`[...document.querySelectorAll("body *")].filter(e => e.getBoundingClientRect().right > window.innerWidth + 1).slice(0, 8).map(e => e.tagName + "." + e.className + " " + Math.round(e.getBoundingClientRect().right)).join(", ")`))
			t.Fatalf("%s: %v\npage: %.3000s\nterminal: %s\nwider than the window: %s", what, err, text, term, wide)
		}
	}

	// A wrong key is refused on the sign-in page.
	run("wrong key", chromedp.Navigate(d.api+"/console/"), chromedp.WaitVisible(css("#apikey")), shot("signin"),
		chromedp.SendKeys(css("#apikey"), "sbx_nope_nope"), chromedp.Click(css(`button[type="submit"]`)),
		chromedp.WaitVisible(css(`[role="alert"]`)))

	run("sign in as org A", signIn(keyA), chromedp.Navigate(d.api+"/console/#/sandboxes"),
		waitJS(textHas("main", "No sandbox matches")))

	code, body := d.rest(t, keyA, "POST", "/v1/sandboxes", map[string]any{"spec": map[string]any{
		"tags":       []string{"console-test"},
		"containers": []any{map[string]any{"name": "main", "image": "busybox", "command": "/bin/sh", "args": []string{"-c", `trap "exit 0" TERM; while true; do echo "tick from the sandbox"; sleep 1; done`}}},
	}})
	if code != 200 {
		t.Fatalf("create: %d %s", code, body)
	}
	var sb struct {
		SandboxID string `json:"sandboxId"`
	}
	_ = json.Unmarshal(body, &sb)
	id := sb.SandboxID
	t.Cleanup(func() { d.rest(t, keyA, "DELETE", "/v1/sandboxes/"+id, nil) })

	run("the sandbox appears in the list, running", waitJS(textHas(`[data-testid="sandbox-list"]`, id)),
		waitJS(textHas(`[data-testid="sandbox-list"]`, "running")), shot("sandboxes"),
		// The filters: by tag and by runner, each matching and not.
		chromedp.Navigate(d.api+"/console/#/sandboxes?tag=console-test"), waitJS(textHas(`[data-testid="sandbox-list"]`, id)),
		chromedp.Navigate(d.api+"/console/#/sandboxes?tag=other-tag"), waitJS(textHas("main", "No sandbox matches")),
		chromedp.Navigate(d.api+"/console/#/sandboxes?runner=local"), waitJS(textHas(`[data-testid="sandbox-list"]`, id)),
		chromedp.Navigate(d.api+"/console/#/sandboxes?runner=elsewhere"), waitJS(textHas("main", "No sandbox matches")))
	run("overview", chromedp.Navigate(d.api+"/console/#/"), waitJS(textHas("main", "Runners")),
		waitJS(`[...document.querySelectorAll(".cards a")].some(a => a.textContent.includes("running") && a.querySelector(".num").textContent === "1")`),
		shot("overview"))
	run("detail, logs and terminal", chromedp.Navigate(d.api+"/console/#/sandboxes/"+id),
		waitJS(textHas(`[data-testid="logs"]`, "tick from the sandbox")),
		waitJS(textHas(`[data-testid="term-status"]`, "connected")),
		// The shell's prompt (xterm.js renders only while the terminal is on screen), then
		// the command typed into the terminal.
		waitJS(`(document.querySelector('[data-testid="terminal"]').scrollIntoView(), true)`),
		waitJS(`(document.querySelector(".xterm-rows")?.textContent || "").includes("#")`),
		chromedp.Click(css(".xterm-screen")),
		// The text as an input method inserts it (xterm.js takes synthesized printable key
		// events for its own shortcuts), then the Enter key.
		chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			_, err := cdp.Call(ctx, t, input.InsertText, input.InsertTextParams{Text: "echo hello-console"})
			return err
		}),
		chromedp.KeyEvent(kb.Enter),
		// The command's echo and its output: twice.
		waitJS(`(document.querySelector(".xterm-rows")?.textContent || "").split("hello-console").length >= 3`),
		shot("sandbox"))

	// Files: the directory listing, an upload (the file lands in the sandbox), a download
	// (the browser saves the same bytes), an oversized upload refused.
	tmp := t.TempDir()
	upPath, bigPath, dlDir := filepath.Join(tmp, "hello-upload.txt"), filepath.Join(tmp, "big.bin"), filepath.Join(tmp, "downloads")
	upBody := []byte("uploaded from the console\n\x00\xff binary too\n")
	if err := os.WriteFile(upPath, upBody, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bigPath, make([]byte, 600<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dlDir, 0o755); err != nil {
		t.Fatal(err)
	}
	run("files", waitJS(`(document.querySelector('[data-testid="files"]').scrollIntoView(), true)`),
		waitJS(textHas(`[data-testid="file-list"]`, "etc/")),
		clickJS(`[data-testid="file-list"] a`, "tmp/"), waitJS(`document.querySelector('input[name="dir"]').value === "/tmp"`),
		waitJS(`!document.querySelector('[data-testid="file-list"]') || !document.querySelector('[data-testid="file-list"]').textContent.includes("etc/")`),
		chromedp.SetUploadFiles(css(`input[type="file"]`), []string{upPath}),
		chromedp.Click(css(`form[aria-label="Upload"] button[type="submit"]`)),
		waitJS(textHas(`[data-testid="files-status"]`, "uploaded hello-upload.txt")),
		waitJS(textHas(`[data-testid="file-list"]`, "hello-upload.txt")),
		chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
			_, err := chromedp.Call(ctx, cdpbrowser.SetDownloadBehavior, cdpbrowser.SetDownloadBehaviorParams{
				Behavior: cdpbrowser.SetDownloadBehaviorBehaviorAllow, DownloadPath: dlDir})
			return err
		}),
		chromedp.Click(css(`button[aria-label="Download hello-upload.txt"]`)),
		waitFile(filepath.Join(dlDir, "hello-upload.txt"), upBody),
		waitJS(textHas(`[data-testid="files-status"]`, "downloaded hello-upload.txt")),
		waitJS(`(document.querySelector('[data-testid="files"]').scrollIntoView(), true)`), shot("files"),
		chromedp.SetUploadFiles(css(`input[type="file"]`), []string{bigPath}),
		chromedp.Click(css(`form[aria-label="Upload"] button[type="submit"]`)),
		waitJS(textHas(`[data-testid="files"] [role="alert"]`, "at most 512.0 KiB")))
	code, body = d.rest(t, keyA, "GET", "/v1/sandboxes/"+id+":readFile?path=/tmp/hello-upload.txt", nil)
	var rf struct {
		Content []byte `json:"content"`
	}
	if err := json.Unmarshal(body, &rf); code != 200 || err != nil || !bytes.Equal(rf.Content, upBody) {
		t.Fatalf("the uploaded file, read through the API: %d %s", code, body)
	}
	if _, err := os.Stat(filepath.Join(dlDir, "big.bin")); err == nil {
		t.Fatal("the oversized file was uploaded")
	}
	if code, body = d.rest(t, keyA, "GET", "/v1/sandboxes/"+id+":readFile?path=/tmp/big.bin", nil); code == 200 {
		t.Fatalf("the oversized file is in the sandbox: %s", body)
	}

	// On a phone-sized screen nothing overflows the page sideways (tables scroll in place).
	run("narrow screen", chromedp.EmulateViewport(390, 844), waitJS(`document.documentElement.scrollWidth <= window.innerWidth`),
		shot("sandbox-narrow"), chromedp.EmulateViewport(1100, 760))

	// A template of org A (created by its admin) for the pages below.
	code, body = d.rest(t, adminA, "POST", "/v1/sandboxTemplates", map[string]any{"displayName": "console-tmpl",
		"spec": map[string]any{"containers": []any{map[string]any{"name": "main", "image": "busybox"}}}})
	if code != 200 {
		t.Fatalf("create template: %d %s", code, body)
	}
	var tmpl struct {
		ID string `json:"sandboxTemplateId"`
	}
	_ = json.Unmarshal(body, &tmpl)

	// Org A's user key: its pages show what the API lets it see, and the API's refusals
	// (with their reasons) where it may not.
	run("user key: admin pages refused with the API's reason",
		chromedp.Navigate(d.api+"/console/#/apikeys"), waitJS(textHas(`main [role="alert"]`, "CWSANDBOX_PERMISSION_DENIED")),
		chromedp.Click(css(`form[aria-label="Create an API key"] button[type="submit"]`)),
		waitJS(`document.querySelectorAll('main [role="alert"]').length === 2`),
		waitJS(`!document.querySelector('[data-testid="new-secret"]')`),
		chromedp.Navigate(d.api+"/console/#/audit"), waitJS(textHas(`main [role="alert"]`, "CWSANDBOX_PERMISSION_DENIED")),
		chromedp.Navigate(d.api+"/console/#/runners"), waitJS(textHas(`main [role="alert"]`, "CWSANDBOX_PERMISSION_DENIED")),
		chromedp.Navigate(d.api+"/console/#/templates"), waitJS(textHas(`[data-testid="template-list"]`, tmpl.ID)),
		waitJS(textHas(`[data-testid="template-list"]`, "console-tmpl")),
		chromedp.Click(css(`[data-testid="template-list"] button.danger`)),
		chromedp.Click(css(`[data-testid="template-list"] [role="alertdialog"] button.danger`)),
		waitJS(textHas(`[data-testid="template-list"] [role="alert"]`, "CWSANDBOX_PERMISSION_DENIED")),
		chromedp.Navigate(d.api+"/console/#/snapshots"), waitJS(textHas("main", "Snapshots")),
		waitJS(`!!document.querySelector('main [role="alert"], [data-testid="snapshot-list"]') || document.querySelector("main").textContent.includes("No snapshot")`),
		chromedp.Navigate(d.api+"/console/#/volumes"), waitJS(textHas("main", "Volumes")),
		waitJS(`!!document.querySelector('main [role="alert"], [data-testid="volume-list"]') || document.querySelector("main").textContent.includes("No volume")`))

	// Org B sees none of it, and cannot reach it by its URL either.
	run("org B", chromedp.Click(css(`header button`)), chromedp.WaitVisible(css("#apikey")),
		signIn(keyB), waitJS(textHas(`[data-testid="who"]`, "org-b")),
		chromedp.Navigate(d.api+"/console/#/sandboxes?state=STATE_RUNNING"), waitJS(textHas("main", "No sandbox matches")),
		chromedp.Navigate(d.api+"/console/#/sandboxes/"+id), waitJS(textHas(`[role="alert"]`, "not found")),
		chromedp.Navigate(d.api+"/console/#/templates"), waitJS(textHas("main", "No template.")))
	bodyB, err := chromedp.Run(ctx, chromedp.Text(css("body")))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(bodyB, "tick from the sandbox") || strings.Contains(bodyB, "console-test") {
		t.Fatalf("org B's page shows org A's sandbox: %s", bodyB)
	}

	// Org A's admin: API keys (create: the secret shown once, and it works; revoke: it no
	// longer does), the audit log with its filters, templates deleted after confirmation,
	// the runners' policies.
	run("admin: sign in", chromedp.Click(css(`header button`)), chromedp.WaitVisible(css("#apikey")), signIn(adminA),
		chromedp.Navigate(d.api+"/console/#/apikeys"), waitJS(textHas(`[data-testid="key-list"]`, "(this session)")),
		setInput(`input[name="keyname"]`, "ci-console"), setInput(`select[name="role"]`, "SANDBOX_USER"),
		chromedp.Click(css(`form[aria-label="Create an API key"] button[type="submit"]`)),
		chromedp.WaitVisible(css(`[data-testid="new-secret"]`)), shot("apikeys"))
	secret, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('[data-testid="new-secret"]').textContent`))
	if err != nil || !strings.HasPrefix(secret, "sbx_") {
		t.Fatalf("the new key's secret: %q %v", secret, err)
	}
	newID, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('[data-testid="created-key"] p code').textContent`))
	if err != nil || newID == "" {
		t.Fatalf("the new key's ID: %q %v", newID, err)
	}
	if code, body := d.rest(t, secret, "GET", "/v1/sandboxes", nil); code != 200 {
		t.Fatalf("the key the console created: %d %s", code, body)
	}
	run("admin: the secret goes once dismissed; revoke", clickJS(`[data-testid="created-key"] button`, "Done"),
		waitJS(fmt.Sprintf(`!document.body.innerHTML.includes(%q)`, secret)),
		waitJS(textHas(`[data-testid="key-list"]`, "ci-console")),
		chromedp.Click(css(fmt.Sprintf(`tr[data-key=%q] button.danger`, newID))),
		chromedp.Click(css(fmt.Sprintf(`tr[data-key=%q] [role="alertdialog"] button.danger`, newID))),
		waitJS(textHas(fmt.Sprintf(`tr[data-key=%q]`, newID), "revoked")))
	if code, body := d.rest(t, secret, "GET", "/v1/sandboxes", nil); code != 401 {
		t.Fatalf("the key revoked in the console still works: %d %s", code, body)
	}
	run("admin: audit log and its filters", chromedp.Navigate(d.api+"/console/#/audit"),
		waitJS(textHas(`[data-testid="audit-list"]`, "apikey.create")), waitJS(textHas(`[data-testid="audit-list"]`, "apikey.revoke")),
		shot("audit"),
		setInput(`input[name="method"]`, "RevokeApiKey"), chromedp.Click(css(`form[aria-label="Filters"] button[type="submit"]`)),
		waitJS(`!document.querySelector('[data-testid="audit-list"]').textContent.includes("apikey.create")`),
		waitJS(textHas(`[data-testid="audit-list"]`, "apikey.revoke")), waitJS(textHas(`[data-testid="audit-list"]`, newID)),
		setInput(`input[name="method"]`, ""), setInput(`select[name="result"]`, "PERMISSION_DENIED"),
		chromedp.Click(css(`form[aria-label="Filters"] button[type="submit"]`)),
		waitJS(textHas(`[data-testid="audit-list"]`, "CWSANDBOX_PERMISSION_DENIED")),
		waitJS(`![...document.querySelectorAll('[data-testid="audit-list"] tbody .badge')].some(b => b.textContent.trim() === "OK")`),
		setInput(`select[name="result"]`, ""), setInput(`input[name="start"]`, time.Now().Add(24*time.Hour).Format("2006-01-02T15:04")),
		chromedp.Click(css(`form[aria-label="Filters"] button[type="submit"]`)), waitJS(textHas("main", "No event matches")),
		setInput(`input[name="start"]`, time.Now().Add(-time.Hour).Format("2006-01-02T15:04")),
		chromedp.Click(css(`form[aria-label="Filters"] button[type="submit"]`)), waitJS(textHas(`[data-testid="audit-list"]`, "apikey.revoke")))
	run("admin: delete a template after confirmation", chromedp.Navigate(d.api+"/console/#/templates"),
		waitJS(textHas(`[data-testid="template-list"]`, tmpl.ID)),
		chromedp.Click(css(`[data-testid="template-list"] button.danger`)),
		chromedp.Click(css(`[data-testid="template-list"] [role="alertdialog"] button.danger`)),
		waitJS(textHas("main", "No template.")))
	if code, body := d.rest(t, adminA, "GET", "/v1/sandboxTemplates/"+tmpl.ID, nil); code != 404 {
		t.Fatalf("the template deleted in the console: %d %s", code, body)
	}
	origPolicy := func() json.RawMessage {
		code, body := d.rest(t, d.admin, "GET", "/v1/sandbox/managedRunners?pageSize=1", nil)
		var mrs struct {
			ManagedRunners []struct {
				RunnerID string          `json:"runnerId"`
				Policy   json.RawMessage `json:"policy"`
			} `json:"managedRunners"`
		}
		if err := json.Unmarshal(body, &mrs); code != 200 || err != nil || len(mrs.ManagedRunners) == 0 {
			t.Fatalf("list managed runners: %d %s", code, body)
		}
		return mrs.ManagedRunners[0].Policy
	}()
	run("runners and policies", chromedp.Click(css(`header button`)), chromedp.WaitVisible(css("#apikey")), signIn(d.admin),
		chromedp.Navigate(d.api+"/console/#/runners"), waitJS(`!!document.querySelector('[data-testid="runner-policy"]')`),
		waitJS(`/^(\{|null)/.test(document.querySelector('[data-testid="policy"]').textContent.trim())`),
		// A policy the API refuses: its reason and field violation shown inline; then a
		// valid one, saved.
		clickJS(`[data-testid="runner-policy"] button`, "Edit policy"), chromedp.WaitVisible(css(`textarea[name="policy"]`)),
		setInput(`textarea[name="policy"]`, `{"constraints": {"lifetime": {"max_seconds": -5}}}`),
		clickJS(`[data-testid="policy-editor"] button`, "Save"),
		waitJS(textHas(`[data-testid="policy-editor"] [role="alert"]`, "CWSANDBOX_INVALID_REQUEST")),
		waitJS(textHas(`[data-testid="policy-editor"] [data-testid="violations"]`, "constraints.lifetime.max_seconds")),
		waitJS(textHas(`[data-testid="policy-editor"] [data-testid="violations"]`, "must not be negative")),
		waitJS(`(document.querySelector('[data-testid="policy-editor"] [data-testid="violations"]').scrollIntoView({block: "end"}), true)`),
		shot("policy-invalid"),
		setInput(`textarea[name="policy"]`, `{"constraints": {"lifetime": {"max_seconds": 2592000}}}`),
		clickJS(`[data-testid="policy-editor"] button`, "Save"),
		waitJS(textHas(`[data-testid="runner-policy"] [role="status"]`, "Saved")),
		waitJS(textHas(`[data-testid="policy"]`, "2592000")), shot("runners"))
	var mr struct {
		RunnerID string          `json:"runnerId"`
		Etag     string          `json:"etag"`
		Policy   json.RawMessage `json:"policy"`
	}
	code, body = d.rest(t, d.admin, "GET", "/v1/sandbox/managedRunners?pageSize=1", nil)
	var mrs struct {
		ManagedRunners []json.RawMessage `json:"managedRunners"`
	}
	if err := json.Unmarshal(body, &mrs); code != 200 || err != nil || len(mrs.ManagedRunners) == 0 {
		t.Fatalf("list managed runners: %d %s", code, body)
	}
	_ = json.Unmarshal(mrs.ManagedRunners[0], &mr)
	if !bytes.Contains(mr.Policy, []byte("2592000")) {
		t.Fatalf("the policy saved in the console: %s", mr.Policy)
	}
	// An edit that another writer overtook: refused at its etag, then reloaded.
	run("policy etag conflict", clickJS(`[data-testid="runner-policy"] button`, "Edit policy"),
		chromedp.WaitVisible(css(`textarea[name="policy"]`)),
		chromedp.Func(func(context.Context, *chromedp.Target) error {
			code, body := d.rest(t, d.admin, "PATCH", "/v1/sandbox/managedRunners/"+mr.RunnerID+"?updateMask=policy",
				map[string]any{"policy": map[string]any{"constraints": map[string]any{"lifetime": map[string]any{"max_seconds": 2591999}}}})
			if code != 200 {
				return fmt.Errorf("PATCH policy: %d %s", code, body)
			}
			return nil
		}),
		setInput(`textarea[name="policy"]`, `{}`), clickJS(`[data-testid="policy-editor"] button`, "Save"),
		waitJS(textHas(`[data-testid="policy-editor"] [role="alert"]`, "CWSANDBOX_ETAG_MISMATCH")),
		clickJS(`[data-testid="policy-editor"] button`, "Reload it"),
		waitJS(`document.querySelector('textarea[name="policy"]').value.includes("2591999")`),
		clickJS(`[data-testid="policy-editor"] button`, "Cancel"))
	if code, body := d.rest(t, d.admin, "PATCH", "/v1/sandbox/managedRunners/"+mr.RunnerID+"?updateMask=policy",
		map[string]any{"policy": json.RawMessage(orDefault(origPolicy))}); code != 200 {
		t.Fatalf("restore the policy: %d %s", code, body)
	}
	run("narrow admin pages",
		chromedp.EmulateViewport(390, 844), waitJS(`document.documentElement.scrollWidth <= window.innerWidth`),
		chromedp.Navigate(d.api+"/console/#/apikeys"), waitJS(`!!document.querySelector('[data-testid="key-list"]')`),
		waitJS(`document.documentElement.scrollWidth <= window.innerWidth`), chromedp.EmulateViewport(1100, 760))

	// Org A stops it, with confirmation.
	run("stop", chromedp.Click(css(`header button`)), chromedp.WaitVisible(css("#apikey")),
		signIn(keyA), chromedp.Navigate(d.api+"/console/#/sandboxes/"+id),
		chromedp.WaitVisible(css(`button.danger`)), chromedp.Click(css(`button.danger`)),
		chromedp.WaitVisible(css(`[role="alertdialog"] button.danger`)),
		chromedp.Click(css(`[role="alertdialog"] button.danger`)),
		waitJS(`/terminat/.test(document.querySelector("h2 .badge")?.textContent || "")`))
	code, body = d.rest(t, keyA, "GET", "/v1/sandboxes/"+id, nil)
	if code == 200 && !bytes.Contains(body, []byte("STATE_TERMINAT")) {
		t.Fatalf("after stop: %d %s", code, body)
	}
}
