package gateway

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/placement"
	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

const warmField = `sandbox_template.attachments["sandboxd.warmPool"]`

func warmAttachments(t *testing.T, js string) *structpb.Struct {
	t.Helper()
	a := &structpb.Struct{}
	if err := protojson.Unmarshal([]byte(js), a); err != nil {
		t.Fatal(err)
	}
	return a
}

func TestWarmPoolAttachmentValidation(t *testing.T) {
	s := newTemplateGateway(t, t.TempDir(), &acceptingRunner{id: "r1"})
	admin := tmplAdmin(testOrg)
	for i, c := range []struct {
		js    string
		field string // "" = accepted
	}{
		{`{"sandboxd.warmPool": {"size": 2}}`, ""},
		{`{"sandboxd.warmPool": {"size": 0}}`, ""},
		{`{"sandboxd.warmPool": {"size": 16}, "mine": {"size": 99}, "sandboxdx": 1}`, ""},
		{`{"sandboxd.warmPool": {"size": 17}}`, warmField},
		{`{"sandboxd.warmPool": {"size": -1}}`, warmField},
		{`{"sandboxd.warmPool": {"size": 1.5}}`, warmField},
		{`{"sandboxd.warmPool": {"size": "2"}}`, warmField},
		{`{"sandboxd.warmPool": {}}`, warmField},
		{`{"sandboxd.warmPool": {"size": 1, "ttl": 3}}`, warmField},
		{`{"sandboxd.warmPool": 2}`, warmField},
		{`{"sandboxd.warmpool": {"size": 2}}`, `sandbox_template.attachments["sandboxd.warmpool"]`},
		{`{"sandboxd.other": true}`, `sandbox_template.attachments["sandboxd.other"]`},
	} {
		tp := pyTemplate(fmt.Sprintf("w%d", i))
		tp.Attachments = warmAttachments(t, c.js)
		got, err := createTemplate(admin, s, tp, "")
		if c.field == "" {
			if err != nil {
				t.Fatalf("%s: %v", c.js, err)
			}
			continue
		}
		wantTmplErr(t, err, connect.CodeInvalidArgument, apierr.InvalidRequest, c.field)
		_ = got
	}
	// An update is checked the same way.
	tp, err := createTemplate(admin, s, pyTemplate("upd"), "")
	if err != nil {
		t.Fatal(err)
	}
	_, err = updateTemplate(admin, s, tp.GetSandboxTemplateId(), &sandboxv1.SandboxTemplate{Attachments: warmAttachments(t, `{"sandboxd.warmPool": {"size": 100}}`)}, "attachments")
	wantTmplErr(t, err, connect.CodeInvalidArgument, apierr.InvalidRequest, warmField)
}

func FuzzWarmPoolSize(f *testing.F) {
	for _, s := range []string{`{"sandboxd.warmPool": {"size": 2}}`, `{"sandboxd.warmPool": {"size": 1e300}}`, `{"sandboxd.x": null}`, `{"a": 1}`,
		`{"sandboxd.warmPool": {"size": -0}}`, `{"sandboxd.warmPool": {"size": 16.0000001}}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, js string) {
		a := &structpb.Struct{}
		if protojson.Unmarshal([]byte(js), a) != nil {
			return
		}
		n, vs := warmPoolSize("a", a)
		if n < 0 || n > runtime.MaxWarmSize {
			t.Fatalf("size %d out of range for %s", n, js)
		}
		for _, v := range vs {
			if !strings.HasPrefix(v.Field, `a["sandboxd.`) {
				t.Fatalf("violation %q for %s", v.Field, js)
			}
		}
	})
}

func storedTemplate(t *testing.T, id, org, image, att string, deleted bool) store.Template {
	t.Helper()
	p := &sandboxv1.PartialSandboxSpec{Containers: []*sandboxv1.PartialContainer{{Image: image, Command: "sleep", Args: []string{"inf"}}}}
	b, err := proto.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	st := store.Template{ID: id, Org: org, Spec: b, Attachments: []byte(att)}
	if deleted {
		now := time.Now()
		st.DeleteTime = &now
	}
	return st
}

func TestWarmDesired(t *testing.T) {
	tmpls := warmTemplates([]store.Template{
		storedTemplate(t, "py", "acme", "python:3.11", `{"sandboxd.warmPool": {"size": 2}}`, false),
		storedTemplate(t, "bb", "globex", "ghcr.io/x/busybox", `{"sandboxd.warmPool": {"size": 1}}`, false),
		storedTemplate(t, "gone", "acme", "python:3.11", `{"sandboxd.warmPool": {"size": 3}}`, true), // deleted: dropped
		storedTemplate(t, "zero", "acme", "python:3.11", `{"sandboxd.warmPool": {"size": 0}}`, false),
		storedTemplate(t, "none", "acme", "python:3.11", `{"k": 1}`, false),
		storedTemplate(t, "bad", "acme", "python:3.11", `{"sandboxd.warmPool": {"size": 99}}`, false), // stored before validation: no pool
		storedTemplate(t, "plain", "globex", "ghcr.io/x/plain", "", false),                            // no attachments: pre-pull only
		storedTemplate(t, "gone2", "globex", "ghcr.io/x/gone", "", true),                              // deleted: dropped
	})
	var names []string
	for _, w := range tmpls {
		names = append(names, fmt.Sprintf("%s:%d", w.ID, w.Size))
	}
	if n := strings.Join(names, ","); n != "py:2,bb:1,zero:0,none:0,bad:0,plain:0" {
		t.Fatalf("warm templates = %s", n)
	}
	dockerOnly, err := policy.Parse([]byte(`{"constraints": {"images": {"allowed_registries": ["docker.io"]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	runners := []placement.Runner{
		{ID: "open", Ready: true},
		{ID: "docker-only", Ready: true, Policy: dockerOnly, PolicyRevision: "3"},
		{ID: "down", Ready: false},
	}
	got := warmDesired(tmpls, runners, policy.RunnerPlatform(nil), nil)
	keys := func(ts []runtime.WarmTarget) string {
		var out []string
		for _, t := range ts {
			out = append(out, fmt.Sprintf("%s:%s:%d", t.Key, t.Spec.Image, t.Size))
		}
		return strings.Join(out, ",")
	}
	// Templates without a warm pool are sent with Size 0 (their images are pre-pulled).
	if k := keys(got[0]); k != "acme/py:python:3.11:2,globex/bb:ghcr.io/x/busybox:1,acme/zero:python:3.11:0,acme/none:python:3.11:0,acme/bad:python:3.11:0,globex/plain:ghcr.io/x/plain:0" {
		t.Errorf("open runner: %s", k)
	}
	if k := keys(got[1]); k != "acme/py:python:3.11:2,acme/zero:python:3.11:0,acme/none:python:3.11:0,acme/bad:python:3.11:0" { // its policy rejects ghcr.io
		t.Errorf("docker-only runner: %s", k)
	}
	if got[2] != nil {
		t.Errorf("a runner that is not ready is sent %v", got[2])
	}
	// The spec is the runtime spec a create of the template sends (resolved: class).
	if s := got[0][0].Spec; s.Container.Command != "sleep" || s.RuntimeClass == "" || s.ID != "" {
		t.Errorf("target spec = %+v", s)
	}
}

// warmRunner records the warm sets it is sent.
type warmRunner struct {
	acceptingRunner
	mu   sync.Mutex
	sets [][]runtime.WarmTarget
}

func (r *warmRunner) SetWarmPools(_ context.Context, targets []runtime.WarmTarget) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sets = append(r.sets, targets)
	return nil
}

func (r *warmRunner) last() ([]runtime.WarmTarget, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.sets) == 0 {
		return nil, 0
	}
	return r.sets[len(r.sets)-1], len(r.sets)
}

// Template writes send the runners their new warm set (replace-whole): create, resize,
// delete.
func TestWarmSyncOnTemplateWrites(t *testing.T) {
	r := &warmRunner{acceptingRunner: acceptingRunner{id: "r1"}}
	s := newTemplateGateway(t, t.TempDir(), r)
	admin := tmplAdmin(testOrg)
	waitFor := func(what string, ok func([]runtime.WarmTarget) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			last, n := r.last()
			if n > 0 && ok(last) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: last set %+v (%d sent)", what, last, n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	tp := pyTemplate("warm")
	tp.Attachments = warmAttachments(t, `{"sandboxd.warmPool": {"size": 2}}`)
	created, err := createTemplate(admin, s, tp, "")
	if err != nil {
		t.Fatal(err)
	}
	waitFor("after create", func(ts []runtime.WarmTarget) bool {
		return len(ts) == 1 && ts[0].Size == 2 && ts[0].Spec.Image == "python:3.11" && ts[0].Key == testOrg+"/"+created.GetSandboxTemplateId()
	})
	if _, err := updateTemplate(admin, s, created.GetSandboxTemplateId(), &sandboxv1.SandboxTemplate{Attachments: warmAttachments(t, `{"sandboxd.warmPool": {"size": 5}}`)}, "attachments"); err != nil {
		t.Fatal(err)
	}
	waitFor("after resize", func(ts []runtime.WarmTarget) bool { return len(ts) == 1 && ts[0].Size == 5 })
	if err := deleteTemplate(admin, s, created.GetSandboxTemplateId()); err != nil {
		t.Fatal(err)
	}
	waitFor("after delete", func(ts []runtime.WarmTarget) bool { return len(ts) == 0 })

	// A template without a warm pool is sent with Size 0 (pre-pull), until deleted.
	plain, err := createTemplate(admin, s, pyTemplate("plain"), "")
	if err != nil {
		t.Fatal(err)
	}
	waitFor("after a create without a pool", func(ts []runtime.WarmTarget) bool {
		return len(ts) == 1 && ts[0].Size == 0 && ts[0].Spec.Image == "python:3.11" && ts[0].Key == testOrg+"/"+plain.GetSandboxTemplateId()
	})
	if err := deleteTemplate(admin, s, plain.GetSandboxTemplateId()); err != nil {
		t.Fatal(err)
	}
	waitFor("after its delete", func(ts []runtime.WarmTarget) bool { return len(ts) == 0 })
}

// Beyond the bound, templates with a warm pool are kept first, the rest fill up, all in
// creation order.
func TestMergeTemplates(t *testing.T) {
	at := func(id string, sec int) store.Template {
		return store.Template{ID: id, Org: "o", CreateTime: time.Unix(int64(sec), 0)}
	}
	warm := []store.Template{at("w5", 5), at("w9", 9)}
	live := []store.Template{at("a1", 1), at("b2", 2), at("w5", 5), at("c6", 6)}
	ids := func(ts []store.Template) string {
		var out []string
		for _, t := range ts {
			out = append(out, t.ID)
		}
		return strings.Join(out, ",")
	}
	if got := ids(mergeTemplates(warm, live, 4)); got != "a1,b2,w5,w9" {
		t.Errorf("merge = %s", got)
	}
	if got := ids(mergeTemplates(warm, live, 1)); got != "w5" {
		t.Errorf("merge bounded = %s", got)
	}
}

// Targets of platform-registry images carry pull credentials minted for the template's
// organization (fresh at each send), and every target names its organization.
func TestWarmDesiredRegistryCredentials(t *testing.T) {
	tmpls := warmTemplates([]store.Template{
		storedTemplate(t, "built", "acme", "reg.example:8080/acme/app:v1", `{"sandboxd.warmPool": {"size": 1}}`, false),
		storedTemplate(t, "pub", "globex", "python:3.11", `{"sandboxd.warmPool": {"size": 1}}`, false),
	})
	minted := 0
	mint := func(org, image string) (string, string, bool) {
		if !strings.HasPrefix(image, "reg.example:8080/") {
			return "", "", false
		}
		minted++
		return "sandboxd", fmt.Sprintf("tok-%s-%d", org, minted), true
	}
	runners := []placement.Runner{{ID: "open", Ready: true}}
	got := warmDesired(tmpls, runners, policy.RunnerPlatform(nil), mint)[0]
	if len(got) != 2 {
		t.Fatalf("targets = %+v", got)
	}
	if c := got[0].Spec.PullCredentials; c == nil || c.Password != "tok-acme-1" {
		t.Errorf("registry image target: credentials %+v, want acme's", c)
	}
	if o := got[0].Spec.Meta[runtime.MetaOrg]; o != "acme" {
		t.Errorf("registry image target: org %q", o)
	}
	if c := got[1].Spec.PullCredentials; c != nil {
		t.Errorf("public image target got credentials %+v", c)
	}
	if o := got[1].Spec.Meta[runtime.MetaOrg]; o != "globex" {
		t.Errorf("public image target: org %q", o)
	}
	again := warmDesired(tmpls, runners, policy.RunnerPlatform(nil), mint)[0]
	if c := again[0].Spec.PullCredentials; c == nil || c.Password == got[0].Spec.PullCredentials.Password {
		t.Errorf("a resend reuses credentials %+v", c)
	}
}
