package local

import (
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestRestoreImageWorkDirAndSubPathRecapture: on the local backend, a container that
// sets no working_dir, whose image's working directory lies below the mount of a volume
// restored from a snapshot, starts in that directory with the snapshot's owner and mode
// (and in one the runtime makes when the snapshot lacks it), under runc and gVisor; a volume restored into a
// sandbox that mounts it by sub_path only is captured again (the whole volume), twice,
// and the last capture restored at the root holds everything written on the way.
func TestRestoreImageWorkDirAndSubPathRecapture(t *testing.T) {
	e := volPoolEnv(t)
	vol := func(digest string) []runtime.Volume {
		return []runtime.Volume{{Name: "data", SizeBytes: 32 << 20, RestoreDigest: digest}}
	}
	e.create(volSpec("src", "", []runtime.Volume{{Name: "data", SizeBytes: 32 << 20}}, "exec sleep 3600"))
	sh(t, e.b, "src", "mkdir -p /data/a/b; echo inner > /data/a/b/f; echo top > /data/top")
	without, dWithout, _ := archiveOf(t, e.b, "src", "data")
	prepare(t, e.b, without, dWithout)
	sh(t, e.b, "src", "mkdir -p /data/app/work; echo wd > /data/app/work/f; chown 1234:1234 /data/app/work; chmod 0770 /data/app/work")
	with, dWith, _ := archiveOf(t, e.b, "src", "data")
	prepare(t, e.b, with, dWith)

	// The image's working directory below the restored volume's mount, under runc and
	// gVisor.
	for _, class := range []string{"", GVisorClass} {
		for _, tc := range []struct{ id, digest, want string }{
			{"wd-with", dWith, "/data/app/work\nwd\n1234 770"},
			{"wd-without", dWithout, "/data/app/work\n0 755"},
		} {
			id := tc.id + "-" + map[string]string{"": "runc", GVisorClass: "gvisor"}[class]
			sp := volSpec(id, class, vol(tc.digest), "pwd > /tmp/main-cwd; exec sleep 3600")
			sp.Image = "deepworkdir"
			e.create(sp)
			waitFor(t, func() bool { return sh(t, e.b, id, "cat /tmp/main-cwd 2>/dev/null; true") != "" })
			if got := sh(t, e.b, id, "cat /tmp/main-cwd; cat f 2>/dev/null; stat -c '%u %a' ."); got != tc.want {
				t.Errorf("%s: %q, want %q", id, got, tc.want)
			}
		}
	}

	// sub_path only, restored, captured again, twice.
	only := func(id, digest string) runtime.Spec {
		sp := volSpec(id, "", vol(digest), "exec sleep 3600")
		sp.VolumeMounts = []runtime.VolumeMount{{Volume: "data", Path: "/ab", SubPath: "a/b"}}
		return sp
	}
	e.create(only("sp1", dWithout))
	sh(t, e.b, "sp1", "echo g > /ab/g")
	a2, d2, _ := archiveOf(t, e.b, "sp1", "data")
	prepare(t, e.b, a2, d2)
	e.create(only("sp2", d2))
	sh(t, e.b, "sp2", "cat /ab/g >/dev/null; echo h > /ab/h")
	a3, d3, _ := archiveOf(t, e.b, "sp2", "data")
	prepare(t, e.b, a3, d3)
	e.create(volSpec("root", "", vol(d3), "exec sleep 3600"))
	if got := sh(t, e.b, "root", "cat /data/top /data/a/b/f /data/a/b/g /data/a/b/h"); got != "top\ninner\ng\nh" {
		t.Errorf("after two sub_path-only generations: %q", got)
	}
}
