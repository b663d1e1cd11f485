package local

import (
	"context"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestScratchVolumes runs with the volume pool (btrfs subvolumes) and without it (the
// fallback of a host without btrfs: ext4 images and dirs).
func TestScratchVolumes(t *testing.T) {
	t.Run("pool", func(t *testing.T) {
		e := newEnv(t)
		if !e.b.vols.available() {
			t.Skip("no btrfs volume pool on this host")
		}
		scratchVolumes(t, e)
	})
	t.Run("no pool", func(t *testing.T) {
		scratchVolumes(t, newEnvWith(t, func(c *Config) { c.NoVolumePool = true }))
	})
}

func scratchVolumes(t *testing.T, e *env) {
	const id = "vols"
	e.create(runtime.Spec{ID: id, Container: runtime.Container{Command: "sleep", Args: []string{"3600"}, Resources: runtime.Resources{MemoryBytes: 256 << 20, DiskBytes: 64 << 20}, VolumeMounts: []runtime.VolumeMount{
		{Volume: "mem", Path: "/mem"}, {Volume: "mem", Path: "/mem2"},
		{Volume: "data", Path: "/data"},
		{Volume: "scratch", Path: "/scratch"},
		{Volume: "scratch", Path: "/ro", SubPath: "a/b", ReadOnly: true},
	}},
		Volumes: []runtime.Volume{
			{Name: "mem", Medium: runtime.MediumMemory, SizeBytes: 32 << 20},
			{Name: "data", SizeBytes: 32 << 20},
			{Name: "scratch"}, // shares the sandbox's 64 MiB disk
		},
	})
	c := agentClient(e.b, id)
	fill := func(dir string) string {
		return "dd if=/dev/zero of=" + dir + "/fill bs=1M count=128 2>&1 | grep -q -E '" + fullErrors + "' && echo full; rm -f " + dir + "/fill"
	}
	for _, tc := range []struct {
		name string
		cmd  string
		want string
	}{
		{"memory volume is a tmpfs", "stat -f -c %T /mem", "tmpfs"},
		{"one volume at two paths shares its content", "echo shared > /mem/x && cat /mem2/x", "shared"},
		{"memory volume size", fill("/mem"), "full"},
		{"sized disk volume has a filesystem of its own", "stat -f -c %t /data; ls -A /data | wc -l", volumeFS(e.b) + "\n0"},
		{"sized disk volume size", fill("/data"), "full"},
		{"volumes belong to the sandbox's root", "stat -c %u:%g /mem /data /scratch /ro", "0:0\n0:0\n0:0\n0:0"},
		{"unsized volume is limited to the sandbox's disk limit", fill("/scratch"), "full"},
		{"sub_path and read-only", "mkdir -p /scratch/a/b && echo in > /scratch/a/b/f && cat /ro/f && (echo x > /ro/g) 2>&1 | grep -o 'Read-only file system'", "in\nRead-only file system"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, _ := execIn(t, c, "sh", "-c", tc.cmd)
			if strings.TrimSpace(out) != tc.want {
				t.Errorf("%s: %q (stderr %q), want %q", tc.cmd, out, errOut, tc.want)
			}
		})
	}
	if err := e.b.Destroy(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, e.state, id)
	if l := lingeringLoops(e.state); len(l) > 0 {
		t.Errorf("loop devices left attached: %v", l)
	}
}

// TestScratchVolumesGVisor: runsc serves the same host dirs through its gofer.
func TestScratchVolumesGVisor(t *testing.T) {
	e := gvisorEnv(t)
	e.create(runtime.Spec{ID: "gvols", RuntimeClass: GVisorClass, Container: runtime.Container{Command: "sleep", Args: []string{"3600"}, Resources: runtime.Resources{MemoryBytes: 256 << 20}, VolumeMounts: []runtime.VolumeMount{{Volume: "mem", Path: "/mem"}, {Volume: "mem", Path: "/mem2", ReadOnly: true},
		{Volume: "data", Path: "/data"}}},
		Volumes: []runtime.Volume{{Name: "mem", Medium: runtime.MediumMemory, SizeBytes: 32 << 20}, {Name: "data", SizeBytes: 32 << 20}},
	})
	c := agentClient(e.b, "gvols")
	for _, tc := range []struct{ cmd, want string }{
		{"uname -r | grep -o gvisor", "gvisor"},
		{"echo shared > /mem/x && cat /mem2/x", "shared"},
		{"(echo x > /mem2/y) 2>&1 | grep -o 'Read-only file system'", "Read-only file system"},
		{"dd if=/dev/zero of=/data/fill bs=1M count=128 2>&1 | grep -q -E '" + fullErrors + "' && echo full", "full"},
	} {
		if out, errOut, _ := execIn(t, c, "sh", "-c", tc.cmd); strings.TrimSpace(out) != tc.want {
			t.Errorf("%s: %q (stderr %q), want %q", tc.cmd, out, errOut, tc.want)
		}
	}
}

// fullErrors are what a write to a full volume fails with: ENOSPC on a filesystem of
// its own (tmpfs, ext4 without the volume pool), EDQUOT at a pool volume's qgroup limit.
const fullErrors = "No space left on device|Disk quota exceeded"

// volumeFS is what `stat -f -c %t` shows for a sized disk volume of b's.
func volumeFS(b *Backend) string {
	if b.vols.available() {
		return "9123683e" // BTRFS_SUPER_MAGIC
	}
	return "ef53" // EXT4_SUPER_MAGIC
}

func TestScratchVolumesRejected(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		name string
		spec runtime.Spec
		want string
	}{
		{"mount of an undeclared volume", runtime.Spec{Container: runtime.Container{VolumeMounts: []runtime.VolumeMount{{Volume: "x", Path: "/x"}}}}, "no such volume"},
		{"reserved path", runtime.Spec{Volumes: []runtime.Volume{{Name: "v"}}, Container: runtime.Container{VolumeMounts: []runtime.VolumeMount{{Volume: "v", Path: "/proc/x"}}}}, "reserved"},
		{"above a reserved path", runtime.Spec{Volumes: []runtime.Volume{{Name: "v"}}, Container: runtime.Container{VolumeMounts: []runtime.VolumeMount{{Volume: "v", Path: "/etc"}}}}, "reserved"},
		{"escaping sub_path", runtime.Spec{Volumes: []runtime.Volume{{Name: "v"}}, Container: runtime.Container{VolumeMounts: []runtime.VolumeMount{{Volume: "v", Path: "/v", SubPath: "../x"}}}}, "sub_path"},
		{"tiny disk volume", runtime.Spec{Volumes: []runtime.Volume{{Name: "v", SizeBytes: 1 << 20}}}, "at least"},
		{"repeated name", runtime.Spec{Volumes: []runtime.Volume{{Name: "v"}, {Name: "v"}}}, "repeated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := tc.spec
			spec.ID, spec.Image, spec.Command = "rejected", "busybox", "true"
			_, err := e.b.Create(context.Background(), &spec)
			if !isErr(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Create = %v, want ErrInvalidSpec mentioning %q", err, tc.want)
			}
		})
	}
}
