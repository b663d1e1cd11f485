package console

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sandboxd/sandboxd/internal/testenv"
)

// browser is a headless Chromium driven against a dev's console.
type browser struct {
	t     *testing.T
	d     *dev
	bctx  context.Context
	ctx   context.Context
	shots string
}

func newBrowser(t *testing.T, d *dev, path string) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.WindowSize(1100, 760), chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelA)
	bctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	if err := chromedp.Do(bctx); err != nil { // starts the browser (with no timeout)
		t.Fatal(err)
	}
	ctx, cancelT := context.WithTimeout(bctx, 8*time.Minute)
	t.Cleanup(cancelT)
	return &browser{t: t, d: d, bctx: bctx, ctx: ctx, shots: os.Getenv("SANDBOXD_CONSOLE_SCREENSHOTS")}
}

func (b *browser) shot(name string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		if b.shots == "" {
			return nil
		}
		png, err := chromedp.CaptureScreenshot()(ctx, t)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(b.shots, name+".png"), png, 0o644)
	})
}

// signIn signs out whoever is signed in and signs in with key.
func (b *browser) signIn(key string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(
		chromedp.Navigate(b.d.api+"/console/"),
		waitJS(`!!document.querySelector("#apikey") || !!document.querySelector('[data-testid="who"]')`),
		waitJS(`(() => { const o = [...document.querySelectorAll("header button")].find(e => e.textContent.trim() === "Sign out"); if (o) o.click(); return true })()`),
		chromedp.WaitVisible(css("#apikey")),
		chromedp.SendKeys(css("#apikey"), key),
		chromedp.Click(css(`button[type="submit"]`)),
		chromedp.WaitVisible(css(`[data-testid="who"]`)),
	)
}

func (b *browser) run(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	sctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	if err := chromedp.Do(sctx, actions...); err != nil {
		dctx, cancel := context.WithTimeout(b.bctx, 10*time.Second)
		defer cancel()
		text, _ := chromedp.Run(dctx, chromedp.Evaluate[string](`document.body.innerText`))
		b.t.Fatalf("%s: %v\npage: %.3000s", what, err, text)
	}
}

// restJSON calls the API with key and decodes its answer into out, failing unless the
// status is want.
func (d *dev) restJSON(t *testing.T, key, method, path string, body any, want int, out any) {
	t.Helper()
	code, b := d.rest(t, key, method, path, body)
	if code != want {
		t.Fatalf("%s %s: %d %s (want %d)", method, path, code, b, want)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
	}
}

// TestConsoleEditsInChromium drives the console's quotas page, its template and volume
// editors and a sandbox's snapshots in a real Chromium: each action goes through the API
// with the session's key (read back through the API afterwards), every refusal is shown
// with its reason (a user key's writes, an organization admin setting its own quota, a
// value the API refuses with its field violation, a stale template revision, a snapshot
// past the quota), and org B sees none of org A's.
func TestConsoleEditsInChromium(t *testing.T) {
	if testing.Short() {
		t.Skip("starts sandboxd dev and Chromium")
	}
	path := chromium(t)
	testenv.RequireRoot(t, "sandboxd dev runs containers")
	d := startDev(t)
	userA, adminA, keyB := d.newKey(t, "org-a"), d.newKeyRole(t, "org-a", "admin"), d.newKey(t, "org-b")
	b := newBrowser(t, d, path)
	alert := func(scope, s string) chromedp.Action[chromedp.Void] {
		return waitJS(fmt.Sprintf(`[...document.querySelectorAll(%q)].some(e => e.textContent.includes(%q))`, scope+` [role="alert"]`, s))
	}

	// Quotas: a user key sees its organization's usage, read only.
	b.run("quotas: user", b.signIn(userA), chromedp.Navigate(d.api+"/console/#/quotas"),
		waitJS(textHas(`[data-testid="quota-usage"]`, "Snapshot bytes")),
		waitJS(textHas(`[data-testid="quota-usage"] tr[data-row="Sandboxes"]`, "unlimited")),
		waitJS(`!document.querySelector('[data-testid="quota-form"]')`))
	// An organization's own admin may not set its own limits, nor read another's.
	b.run("quotas: org admin refused", b.signIn(adminA), chromedp.Navigate(d.api+"/console/#/quotas"),
		chromedp.WaitVisible(css(`[data-testid="quota-form"]`)),
		setInput(`input[name="maxSandboxes"]`, "5"), clickJS(`[data-testid="quota-form"] button`, "Save limits"),
		alert(`[data-testid="quota-form"]`, "CWSANDBOX_PERMISSION_DENIED"),
		setInput(`input[name="org"]`, "org-b"), clickJS(`form[aria-label="Organization"] button`, "Show"),
		alert("main", "CWSANDBOX_PERMISSION_DENIED"))
	var q struct {
		Limits map[string]string `json:"limits"`
	}
	d.restJSON(t, d.admin, "GET", "/v1/quotas/org-a", nil, 200, &q)
	if len(q.Limits) != 0 {
		t.Fatalf("org A's admin set its own quota: %v", q.Limits)
	}
	// The platform's admin sets org A's: a value the form cannot read, one the API
	// refuses (its field violation shown), then valid ones, read back through the API.
	b.run("quotas: platform admin", b.signIn(d.admin), chromedp.Navigate(d.api+"/console/#/quotas"),
		setInput(`input[name="org"]`, "org-a"), clickJS(`form[aria-label="Organization"] button`, "Show"),
		waitJS(textHas(`form[data-testid="quota-form"] h3`, "org-a")),
		setInput(`input[name="maxMemoryBytes"]`, "lots"), clickJS(`[data-testid="quota-form"] button`, "Save limits"),
		alert(`[data-testid="quota-form"]`, "bytes, with a unit"),
		waitJS(`document.querySelector('input[name="maxMemoryBytes"]').getAttribute("aria-invalid") === "true"`),
		setInput(`input[name="maxMemoryBytes"]`, "64Gi"), setInput(`input[name="maxSandboxes"]`, "-5"),
		clickJS(`[data-testid="quota-form"] button`, "Save limits"),
		alert(`[data-testid="quota-form"]`, "CWSANDBOX_INVALID_REQUEST"),
		waitJS(textHas(`[data-testid="quota-form"] [data-testid="violations"]`, "max_sandboxes")),
		setInput(`input[name="maxSandboxes"]`, "7"), setInput(`input[name="maxSnapshots"]`, "0"), setInput(`input[name="maxCpuMillicores"]`, "unlimited"),
		clickJS(`[data-testid="quota-form"] button`, "Save limits"),
		waitJS(textHas(`[data-testid="quota-form"] [role="status"]`, "Saved the limits of org-a")),
		waitJS(textHas(`[data-testid="quota-usage"] tr[data-row="Sandboxes"]`, "7")),
		waitJS(textHas(`[data-testid="quota-set"]`, "Limits last set")), b.shot("quotas"))
	d.restJSON(t, d.admin, "GET", "/v1/quotas/org-a", nil, 200, &q)
	if q.Limits["maxSandboxes"] != "7" || q.Limits["maxMemoryBytes"] != "68719476736" || q.Limits["maxSnapshots"] != "0" || q.Limits["maxCpuMillicores"] != "-1" {
		t.Fatalf("org A's limits set in the console: %v", q.Limits)
	}
	b.run("quotas: the user sees the new limits", b.signIn(userA), chromedp.Navigate(d.api+"/console/#/quotas"),
		waitJS(textHas(`[data-testid="quota-usage"] tr[data-row="Sandboxes"]`, "7")),
		waitJS(textHas(`[data-testid="quota-usage"] tr[data-row="Memory"]`, "64 GiB")),
		waitJS(textHas(`[data-testid="quota-usage"] tr[data-row="CPU (cores)"]`, "unlimited")))

	// Snapshots from a sandbox's page: refused past the quota (0 snapshots) with the
	// reason shown, then taken once the limit is lifted.
	var sb struct {
		SandboxID string `json:"sandboxId"`
	}
	d.restJSON(t, userA, "POST", "/v1/sandboxes", map[string]any{"spec": map[string]any{
		"volumes": []any{map[string]any{"name": "workspace", "scratch": map[string]any{"size": "64Mi"}}},
		"containers": []any{map[string]any{"name": "main", "image": "busybox", "command": "/bin/sh",
			"args":         []string{"-c", `echo snapshot-me > /workspace/f; trap "exit 0" TERM; while true; do sleep 1; done`},
			"volumeMounts": []any{map[string]any{"volume": "workspace", "mountPath": "/workspace"}}}},
	}}, 200, &sb)
	t.Cleanup(func() { d.rest(t, userA, "DELETE", "/v1/sandboxes/"+sb.SandboxID, nil) })
	b.run("snapshot refused by the quota", chromedp.Navigate(d.api+"/console/#/sandboxes/"+sb.SandboxID),
		waitJS(`/running/.test(document.querySelector("h2 .badge")?.textContent || "")`),
		chromedp.WaitVisible(css(`form[aria-label="Take a snapshot"]`)),
		waitJS(`document.querySelector('select[name="scratchVolume"]').value === "workspace"`),
		clickJS(`form[aria-label="Take a snapshot"] button`, "Take snapshot"),
		alert(`[data-testid="sandbox-snapshots"]`, "CWSANDBOX_FSS_QUOTA_EXCEEDED"))
	d.restJSON(t, d.admin, "PUT", "/v1/quotas/org-a", map[string]any{"limits": map[string]any{"maxSandboxes": "7"}}, 200, nil)
	b.run("snapshot taken", clickJS(`form[aria-label="Take a snapshot"] button`, "Take snapshot"),
		waitJS(textHas(`[data-testid="snapshot-status"]`, "Snapshot ")),
		waitJS(`!document.querySelector('[data-testid="sandbox-snapshots"] [role="alert"]')`),
		waitJS(textHas(`[data-testid="sandbox-snapshot-list"]`, "workspace")),
		waitJS(textHas(`[data-testid="sandbox-snapshot-list"]`, "ready")),
		waitJS(`(document.querySelector('[data-testid="sandbox-snapshots"]').scrollIntoView({block: "end"}), true)`), b.shot("snapshot"))
	var snaps struct {
		Snapshots []struct {
			ID    string `json:"fileSystemSnapshotId"`
			State string `json:"state"`
		} `json:"fileSystemSnapshots"`
	}
	d.restJSON(t, userA, "GET", "/v1/fileSystemSnapshots?sourceSandboxId="+sb.SandboxID, nil, 200, &snaps)
	if len(snaps.Snapshots) != 1 || snaps.Snapshots[0].State != "SNAPSHOT_STATE_READY" {
		t.Fatalf("snapshots of %s after the console took one: %+v", sb.SandboxID, snaps)
	}

	// Templates: a user key's edit refused; the admin's: invalid JSON and a spec the API
	// refuses shown, a rename and a new spec saved (only what changed in the mask), an
	// edit overtaken by another writer refused at its revision and reloaded.
	var tmpl struct {
		ID       string `json:"sandboxTemplateId"`
		Name     string `json:"displayName"`
		Revision string `json:"revision"`
		Spec     struct {
			Tags               []string `json:"tags"`
			MaxLifetimeSeconds int      `json:"maxLifetimeSeconds"`
		} `json:"spec"`
		Attachments map[string]any `json:"attachments"`
	}
	d.restJSON(t, adminA, "POST", "/v1/sandboxTemplates", map[string]any{"displayName": "edit-me",
		"spec": map[string]any{"containers": []any{map[string]any{"name": "main", "image": "busybox"}}}, "attachments": map[string]any{"owner": "team-a"}}, 200, &tmpl)
	b.run("template: user refused", chromedp.Navigate(d.api+"/console/#/templates"),
		chromedp.Click(css(fmt.Sprintf(`tr[data-id=%q] button.edit`, tmpl.ID))),
		waitJS(`document.querySelector('input[name="displayName"]')?.value === "edit-me"`),
		setInput(`input[name="displayName"]`, "renamed-by-user"), clickJS(`[data-testid="template-editor"] button`, "Save"),
		alert(`[data-testid="template-editor"]`, "CWSANDBOX_PERMISSION_DENIED"))
	b.run("template: admin edits", b.signIn(adminA), chromedp.Navigate(d.api+"/console/#/templates"),
		chromedp.Click(css(fmt.Sprintf(`tr[data-id=%q] button.edit`, tmpl.ID))),
		waitJS(`document.querySelector('textarea[name="spec"]')?.value.includes("busybox") === true`),
		clickJS(`[data-testid="template-editor"] button`, "Save"),
		waitJS(textHas(`[data-testid="template-editor"] [role="status"]`, "Nothing changed")),
		setInput(`textarea[name="spec"]`, `{"containers": [{"name": "main", "image": "busybox"}`),
		clickJS(`[data-testid="template-editor"] button`, "Save"), alert(`[data-testid="template-editor"]`, "The spec is not JSON"),
		setInput(`textarea[name="spec"]`, `{"containers": [{"name": "main", "image": "busybox"}], "maxLifetimeSeconds": -1}`),
		clickJS(`[data-testid="template-editor"] button`, "Save"), alert(`[data-testid="template-editor"]`, "CWSANDBOX_INVALID_REQUEST"),
		waitJS(textHas(`[data-testid="template-editor"] [data-testid="violations"]`, "sandbox_template.spec.max_lifetime_seconds")),
		waitJS(`(document.querySelector('[data-testid="template-editor"] [data-testid="violations"]').scrollIntoView({block: "end"}), true)`),
		b.shot("template-edit"),
		setInput(`input[name="displayName"]`, "edited"),
		setInput(`textarea[name="spec"]`, `{"containers": [{"name": "main", "image": "busybox"}], "tags": ["from-console"]}`),
		clickJS(`[data-testid="template-editor"] button`, "Save"),
		waitJS(textHas(`[data-testid="saved"]`, "Saved edited: revision 2")),
		waitJS(`!document.querySelector('[data-testid="template-editor"]')`),
		waitJS(textHas(`[data-testid="template-list"]`, "edited")))
	d.restJSON(t, adminA, "GET", "/v1/sandboxTemplates/"+tmpl.ID, nil, 200, &tmpl)
	if tmpl.Name != "edited" || tmpl.Revision != "2" || strings.Join(tmpl.Spec.Tags, ",") != "from-console" || tmpl.Attachments["owner"] != "team-a" {
		t.Fatalf("the template edited in the console: %+v", tmpl)
	}
	b.run("template: revision conflict", chromedp.Click(css(fmt.Sprintf(`tr[data-id=%q] button.edit`, tmpl.ID))),
		waitJS(`document.querySelector('input[name="displayName"]')?.value === "edited"`),
		chromedp.Func(func(context.Context, *chromedp.Target) error {
			code, body := d.rest(t, adminA, "PATCH", "/v1/sandboxTemplates/"+tmpl.ID+"?updateMask=spec.maxLifetimeSeconds", map[string]any{"spec": map[string]any{"maxLifetimeSeconds": 600}})
			if code != 200 {
				return fmt.Errorf("PATCH template: %d %s", code, body)
			}
			return nil
		}),
		setInput(`input[name="displayName"]`, "overwrite"), clickJS(`[data-testid="template-editor"] button`, "Save"),
		alert(`[data-testid="template-editor"]`, "CWSANDBOX_ETAG_MISMATCH"),
		clickJS(`[data-testid="template-editor"] button`, "Reload it"),
		waitJS(`document.querySelector('textarea[name="spec"]').value.includes("600")`),
		waitJS(`document.querySelector('input[name="displayName"]').value === "edited"`),
		clickJS(`[data-testid="template-editor"] button`, "Cancel"))
	d.restJSON(t, adminA, "GET", "/v1/sandboxTemplates/"+tmpl.ID, nil, 200, &tmpl)
	if tmpl.Name != "edited" || tmpl.Revision != "3" || tmpl.Spec.MaxLifetimeSeconds != 600 {
		t.Fatalf("the template after the refused edit: %+v", tmpl)
	}

	// Volumes: a user key's edit refused; the admin's: a new description and a grow,
	// read back; a shrink refused with its field violation shown.
	var vol struct {
		ID   string `json:"volumeId"`
		Spec struct {
			Description, Size string
		} `json:"spec"`
		Status struct{ State string } `json:"status"`
	}
	d.restJSON(t, adminA, "POST", "/v1/volumes", map[string]any{"volumeId": "console-vol", "spec": map[string]any{
		"pvc": map[string]any{"runnerId": "local", "namespace": "default", "claimName": "console-vol"}, "size": "64Mi", "description": "first"}}, 200, &vol)
	t.Cleanup(func() { d.rest(t, adminA, "DELETE", "/v1/volumes/"+vol.ID+"?force=true", nil) })
	deadline := time.Now().Add(time.Minute)
	for vol.Status.State != "VOLUME_STATE_READY" {
		if time.Now().After(deadline) {
			t.Fatalf("volume not ready: %+v", vol)
		}
		time.Sleep(200 * time.Millisecond)
		d.restJSON(t, adminA, "GET", "/v1/volumes/"+vol.ID, nil, 200, &vol)
	}
	b.run("volume: user refused", b.signIn(userA), chromedp.Navigate(d.api+"/console/#/volumes"),
		chromedp.Click(css(fmt.Sprintf(`tr[data-id=%q] button.edit`, vol.ID))),
		waitJS(`document.querySelector('input[name="description"]')?.value === "first"`),
		setInput(`input[name="description"]`, "by user"), clickJS(`[data-testid="volume-editor"] button`, "Save"),
		alert(`[data-testid="volume-editor"]`, "CWSANDBOX_PERMISSION_DENIED"))
	b.run("volume: admin edits", b.signIn(adminA), chromedp.Navigate(d.api+"/console/#/volumes"),
		chromedp.Click(css(fmt.Sprintf(`tr[data-id=%q] button.edit`, vol.ID))),
		waitJS(`document.querySelector('input[name="size"]')?.value === "64Mi"`),
		setInput(`input[name="size"]`, "32Mi"), clickJS(`[data-testid="volume-editor"] button`, "Save"),
		alert(`[data-testid="volume-editor"]`, "CWSANDBOX_INVALID_REQUEST"),
		waitJS(textHas(`[data-testid="volume-editor"] [data-testid="violations"]`, "volume.spec.size")),
		waitJS(`(document.querySelector('[data-testid="volume-editor"] [data-testid="violations"]').scrollIntoView({block: "end"}), true)`), b.shot("volume-edit"),
		setInput(`input[name="size"]`, "128Mi"), setInput(`input[name="description"]`, "second"),
		clickJS(`[data-testid="volume-editor"] button`, "Save"),
		waitJS(textHas(`[data-testid="saved"]`, "Saved "+vol.ID)),
		waitJS(textHas(fmt.Sprintf(`tr[data-id=%q]`, vol.ID), "128Mi")), waitJS(textHas(fmt.Sprintf(`tr[data-id=%q]`, vol.ID), "second")))
	d.restJSON(t, adminA, "GET", "/v1/volumes/"+vol.ID, nil, 200, &vol)
	if vol.Spec.Description != "second" || vol.Spec.Size != "128Mi" {
		t.Fatalf("the volume edited in the console: %+v", vol)
	}

	// Org B sees none of org A's: no template, no volume, no snapshot, not its quota.
	b.run("org B", b.signIn(keyB), chromedp.Navigate(d.api+"/console/#/templates"), waitJS(textHas("main", "No template.")),
		chromedp.Navigate(d.api+"/console/#/volumes"), waitJS(textHas("main", "No volume.")),
		chromedp.Navigate(d.api+"/console/#/snapshots"), waitJS(textHas("main", "No snapshot.")),
		chromedp.Navigate(d.api+"/console/#/sandboxes/"+sb.SandboxID), waitJS(textHas(`[role="alert"]`, "not found")),
		chromedp.Navigate(d.api+"/console/#/quotas"), waitJS(textHas(`[data-testid="quota-usage"]`, "Sandboxes")),
		waitJS(textHas(`[data-testid="quota-usage"] tr[data-row="Sandboxes"]`, "unlimited")),
		setInput(`input[name="org"]`, "org-a"), clickJS(`form[aria-label="Organization"] button`, "Show"),
		alert("main", "CWSANDBOX_PERMISSION_DENIED"))
	text, err := chromedp.Run(b.ctx, chromedp.Text(css("body")))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"edited", vol.ID, "console-vol", snaps.Snapshots[0].ID} {
		if strings.Contains(text, s) {
			t.Fatalf("org B's page shows org A's %q: %s", s, text)
		}
	}

	// On a phone-sized screen the quota form and an editor do not overflow sideways.
	b.run("narrow", b.signIn(d.admin), chromedp.EmulateViewport(390, 844), chromedp.Navigate(d.api+"/console/#/quotas"),
		chromedp.WaitVisible(css(`[data-testid="quota-form"]`)), waitJS(`document.documentElement.scrollWidth <= window.innerWidth`),
		chromedp.EmulateViewport(1100, 760))
}
