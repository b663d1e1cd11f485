package runtime

import (
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// metaKeys are the Spec.Meta keys with the strings they must keep: Meta is persisted
// (the local backend's state dir, the Kubernetes backend's Secrets, the runner's records
// of ended sandboxes), so a changed string would lose what running sandboxes recorded.
var metaKeys = map[string]string{
	MetaOrg:                   "sandboxd.org",
	MetaCaller:                "sandboxd.caller",
	MetaPolicyRevision:        "sandboxd.policy_revision",
	MetaGatewayPolicyRevision: "sandboxd.gateway_policy_revision",
	MetaCreatedAt:             "sandboxd.created_at",
	MetaLifetime:              "sandboxd.lifetime",
	MetaPauseLifetime:         "sandboxd.pause.lifetime",
	MetaAutoResume:            "sandboxd.pause.auto_resume",
	MetaIdlePause:             "sandboxd.pause.idle",
	MetaForkedFrom:            "sandboxd.forked_from",
	MetaAnyID:                 "sandboxd.any_id",
}

func TestMetaKeysStable(t *testing.T) {
	for got, want := range metaKeys {
		if got != want {
			t.Errorf("a Meta key changed to %q; persisted sandboxes carry %q", got, want)
		}
	}
	if len(metaKeys) != 11 {
		t.Errorf("%d Meta keys, want 11 distinct ones", len(metaKeys))
	}
}

// TestMetaKeysOneHome: no Go file of the module spells a Meta key as a literal; every
// use goes through the constant, so readers and writers cannot drift apart.
func TestMetaKeysOneHome(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found: %v", err)
	}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (strings.HasPrefix(n, ".") || n == "gen" || n == "node_modules" || n == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || p == filepath.Join(root, "internal/runtime/meta.go") || p == filepath.Join(root, "internal/runtime/meta_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, key := range metaKeys {
			if strings.Contains(string(b), strconv.Quote(key)) {
				rel, _ := filepath.Rel(root, p)
				t.Errorf("%s spells the Meta key %q: use its runtime.Meta* constant", rel, key)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
