package runner

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/egress"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// egressStateFor is a real egress state (egress.NewSandboxSecrets' CA, exported) for
// one injection of secret into host's Authorization, its CA valid for ttl.
func egressStateFor(t *testing.T, host, secret string, ttl time.Duration) *runtime.EgressState {
	t.Helper()
	ph, err := egress.NewPlaceholder()
	if err != nil {
		t.Fatal(err)
	}
	ss, err := egress.NewSandboxSecrets("src", "org-a", []egress.Injection{{Host: host, Header: "Authorization", Placeholder: ph, Value: "v", Secret: secret}}, ttl)
	if err != nil {
		t.Fatal(err)
	}
	cert, key, injs, err := ss.Export()
	if err != nil {
		t.Fatal(err)
	}
	st := &runtime.EgressState{CACert: cert, CAKey: key}
	for _, in := range injs {
		st.Injections = append(st.Injections, runtime.EgressInjection{Host: in.Host, Header: in.Header, Placeholder: in.Placeholder, Secret: in.Secret})
	}
	return st
}

// TestImportCarriesEgressState (docs/secrets.md, "Forks and moves"): the export of a
// sandbox with egress secrets hands its egress state (CA and key, placeholders) to the
// caller in the ref, never to the blob store; an import on another runner gives that
// state and each target's values (resolved again by the gateway) to its backend. An
// import without the state, with another CA's key, another host's or too many
// injections, without values or with values for a secret no rule names, with a CA that
// would expire before the sandbox ends, or with a state for a sandbox without egress
// secrets is refused before anything is made.
func TestImportCarriesEgressState(t *testing.T) {
	ctx := context.Background()
	store := blobStore(t)
	beA, beB := newPortFake("p1"), newPortFake("p1")
	a := portLocal(t, "r1", beA, "", store)
	b := portLocal(t, "r2", beB, "", store)
	state := egressStateFor(t, "api.example.com", "prod/api#token", 366*24*time.Hour)
	beA.egress = state
	net := &runtime.Network{Egress: []runtime.EgressRule{{DNSName: "api.example.com",
		Secret: &runtime.EgressSecret{Store: "prod", Path: "api", Field: "token", EnvVar: "API_TOKEN"}}}}
	created, err := a.Create(ctx, CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: "busybox"}, Network: net,
		EgressSecretValues: map[string]string{"prod/api#token": "create-value"}, Meta: map[string]string{runtime.MetaOrg: "org-a"}}, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	sb := awaitState(t, a.R, created.ID, StateRunning)
	ref, src, err := a.ExportCheckpoint(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if ref.Egress != state {
		t.Fatalf("the ref's egress state %v, want the backend's", ref.Egress)
	}
	for _, k := range keysUnder(t, store, prefixOf(ref.Key)) {
		rc, err := store.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(rc)
		_ = rc.Close()
		if bytes.Contains(data, state.CAKey) || bytes.Contains(data, []byte(state.Injections[0].Placeholder)) || bytes.Contains(data, []byte("create-value")) {
			t.Fatalf("blob %s holds the egress CA key, a placeholder or the value", k)
		}
	}
	if s := (&CheckpointRef{Egress: state}).Egress.String(); strings.Contains(s, string(state.CAKey)) || !strings.Contains(s, "redacted") {
		t.Fatalf("the state prints as %q", s)
	}

	values := map[string]string{"prod/api#token": "fork-value"}
	target := func(id string, lifetime time.Duration, v map[string]string) []ForkTarget {
		return []ForkTarget{{ID: id, Meta: map[string]string{runtime.MetaOrg: "org-a"}, Lifetime: lifetime, EgressSecretValues: v}}
	}
	res, err := b.ImportFork(ctx, ImportRequest{Ref: ref, Source: src, Targets: target("fork-1", time.Hour, values)})
	if err != nil || len(res) != 1 || res[0].Err != nil {
		t.Fatalf("import = %+v, %v", res, err)
	}
	beB.pmu.Lock()
	got := beB.gotEgress
	beB.pmu.Unlock()
	beB.mu.Lock()
	gotValues := beB.forkValues["fork-1"]
	beB.mu.Unlock()
	if got != state || gotValues["prod/api#token"] != "fork-value" {
		t.Fatalf("the backend got state %v, values %v", got, gotValues)
	}
	if f, _ := b.R.Get("fork-1"); f.Spec.EgressSecretValues != nil {
		t.Fatal("the fork's record keeps the values")
	}

	with := func(f func(st *runtime.EgressState)) *runtime.EgressState {
		st := *state
		st.Injections = slices.Clone(state.Injections)
		f(&st)
		return &st
	}
	other := egressStateFor(t, "api.example.com", "prod/api#token", time.Hour)
	otherHost := egressStateFor(t, "evil.example.com", "prod/api#token", time.Hour)
	short := egressStateFor(t, "api.example.com", "prod/api#token", 30*time.Minute)
	noSecrets := runningSandbox(t, a, map[string]string{runtime.MetaOrg: "org-a"}, time.Hour)
	beA.pmu.Lock()
	beA.egress = nil
	beA.pmu.Unlock()
	plainRef, plainSrc, err := a.ExportCheckpoint(ctx, noSecrets.ID)
	if err != nil {
		t.Fatal(err)
	}
	plainRef.Egress = state
	_, _, forks0 := beB.counts()
	for name, tc := range map[string]struct {
		ref       CheckpointRef
		src       Sandbox
		lifetime  time.Duration
		values    map[string]string
		want      string
		expiresCA bool
	}{
		"no state":                   {ref: withEgress(ref, nil), src: src, values: values, want: "came without"},
		"another CA's key":           {ref: withEgress(ref, with(func(st *runtime.EgressState) { st.CAKey = other.CAKey })), src: src, values: values, want: "not the certificate's key"},
		"another host":               {ref: withEgress(ref, otherHost), src: src, values: values, want: "none for egress[0]"},
		"an extra injection":         {ref: withEgress(ref, with(func(st *runtime.EgressState) { st.Injections = append(st.Injections, st.Injections[0]) })), src: src, values: values, want: "2 injections"},
		"trailing bytes in the cert": {ref: withEgress(ref, with(func(st *runtime.EgressState) { st.CACert = append(slices.Clone(st.CACert), 0) })), src: src, values: values, want: "CA certificate"},
		"huge key":                   {ref: withEgress(ref, with(func(st *runtime.EgressState) { st.CAKey = make([]byte, 1<<20) })), src: src, values: values, want: "CA key of"},
		"no values":                  {ref: ref, src: src, want: "not resolved"},
		"a value for no rule":        {ref: ref, src: src, values: map[string]string{"prod/api#token": "v", "prod/admin#key": "x"}, want: "no egress rule names"},
		"state without secrets":      {ref: plainRef, src: plainSrc, values: nil, want: "no egress secrets"},
		"CA expires before the end":  {ref: withEgress(ref, short), src: src, lifetime: time.Hour, values: values, want: "egress CA", expiresCA: true},
	} {
		lifetime := tc.lifetime
		if lifetime == 0 {
			lifetime = 10 * time.Minute
		}
		_, err := b.ImportFork(ctx, ImportRequest{Ref: tc.ref, Source: tc.src, Targets: target("fork-x", lifetime, tc.values)})
		var verr *ValidationError
		switch {
		case tc.expiresCA:
			if !errors.Is(err, ErrCannotCheckpoint) || apierr.Reason(APIError("fork-x", err, "")) != apierr.CheckpointNotSupported || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: %v", name, err)
			}
		case !errors.As(err, &verr) || !strings.Contains(err.Error(), tc.want):
			t.Errorf("%s: err = %v, want a validation error with %q", name, err, tc.want)
		}
		if _, err := b.R.Get("fork-x"); !errors.Is(err, runtime.ErrNotFound) {
			t.Errorf("%s: the refused fork exists: %v", name, err)
		}
	}
	if _, _, n := beB.counts(); n != forks0 {
		t.Fatalf("refused imports reached the backend (%d forks, was %d)", n, forks0)
	}
	// The short CA is fine for a fork that ends before it.
	if res, err := b.ImportFork(ctx, ImportRequest{Ref: withEgress(ref, short), Source: src, Targets: target("fork-2", 10*time.Minute, values)}); err != nil || res[0].Err != nil {
		t.Fatalf("fork ending before the CA = %+v, %v", res, err)
	}
}

func withEgress(ref CheckpointRef, st *runtime.EgressState) CheckpointRef {
	ref.Egress = st
	return ref
}
