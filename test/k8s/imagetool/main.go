// Command imagetool writes the images the test cluster needs as docker-archive tarballs
// for `ctr images import`: the pause image (busybox running sleep), the standard test
// images (busybox, python; see internal/testimage) and the agent image (the static
// sandbox-agent and sandbox-gate binaries, see internal/runtime/kubernetes).
//
// Usage: imagetool -out DIR [-agent BIN -gate BIN -agent-ref REF]
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// References of the images in the test cluster (imagePullPolicy: Never).
const (
	PauseRef   = "localhost/sandboxd/pause:k8s"
	BusyboxRef = "localhost/" + testimage.Busybox
	PythonRef  = "localhost/" + testimage.Python
)

func main() {
	out := flag.String("out", "", "output dir")
	agent := flag.String("agent", "", "static sandbox-agent binary")
	gate := flag.String("gate", "", "static sandbox-gate binary")
	agentRef := flag.String("agent-ref", "localhost/sandboxd/agent:dev", "agent image reference")
	flag.Parse()
	if err := run(*out, *agent, *gate, *agentRef); err != nil {
		fmt.Fprintln(os.Stderr, "imagetool:", err)
		os.Exit(1)
	}
}

func run(out, agent, gate, agentRef string) error {
	if out == "" {
		return fmt.Errorf("-out is required")
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	std, err := testimage.StandardImages()
	if err != nil {
		return err
	}
	bbLayers, err := std.Busybox.Layers()
	if err != nil {
		return err
	}
	pause, err := testimage.ImageFromLayers(image.Config{
		Entrypoint: []string{"/bin/sleep"}, Cmd: []string{"2147483647"}, Env: []string{testimage.DefaultPath},
	}, bbLayers...)
	if err != nil {
		return err
	}
	imgs := []struct {
		file, ref string
		img       v1.Image
	}{
		{"pause.tar", PauseRef, pause},
		{"busybox.tar", BusyboxRef, std.Busybox},
		{"python.tar", PythonRef, std.Python},
	}
	if agent != "" {
		files := map[string][]byte{}
		for dst, src := range map[string]string{"sandbox-agent": agent, "sandbox-gate": gate} {
			b, err := os.ReadFile(src)
			if err != nil {
				return err
			}
			files[dst] = b
		}
		layer, err := testimage.ExecutableLayer(files)
		if err != nil {
			return err
		}
		img, err := testimage.ImageFromLayers(image.Config{Entrypoint: []string{"/sandbox-gate"}}, layer)
		if err != nil {
			return err
		}
		imgs = append(imgs, struct {
			file, ref string
			img       v1.Image
		}{"agent.tar", agentRef, img})
	}
	for _, i := range imgs {
		tag, err := name.NewTag(i.ref)
		if err != nil {
			return err
		}
		if err := tarball.WriteToFile(filepath.Join(out, i.file), tag, i.img); err != nil {
			return fmt.Errorf("write %s: %w", i.file, err)
		}
	}
	return nil
}
