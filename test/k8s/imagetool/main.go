// Command imagetool writes the images the test cluster needs as docker-archive tarballs
// for `ctr images import`: the pause image (busybox running sleep), the standard test
// images (busybox, python; see internal/testimage) and busybox with a working dir in its
// config (the backend conformance suite's WorkDirImage). The runner and agent images come from
// scripts/build-runner-image.sh (deploy/image).
//
// Usage: imagetool -out DIR
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
	WorkDirRef = "localhost/" + testimage.BusyboxWorkDir
	DeepRef    = "localhost/" + testimage.BusyboxDeepWorkDir
)

func main() {
	out := flag.String("out", "", "output dir")
	flag.Parse()
	if err := run(*out); err != nil {
		fmt.Fprintln(os.Stderr, "imagetool:", err)
		os.Exit(1)
	}
}

func run(out string) error {
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
	workdir, err := testimage.ImageFromLayers(image.Config{Cmd: []string{"/bin/sh"}, Env: []string{testimage.DefaultPath}, WorkingDir: testimage.WorkDir}, bbLayers...)
	if err != nil {
		return err
	}
	deep, err := testimage.ImageFromLayers(image.Config{Cmd: []string{"/bin/sh"}, Env: []string{testimage.DefaultPath}, WorkingDir: testimage.DeepWorkDir}, bbLayers...)
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
		{"busybox-workdir.tar", WorkDirRef, workdir},
		{"busybox-deepworkdir.tar", DeepRef, deep},
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
