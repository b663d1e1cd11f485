package testimage

import "errors"

// Docker Hub names of the standard images, as an official client writes them
// ("python:3.11" is docker.io/library/python:3.11). A registry holding these,
// configured as the mirror for docker.io, serves such references locally.
const (
	DockerHubBusybox = "library/busybox:latest"
	DockerHubPython  = "library/python:3.11"
)

// PushDockerHubNames pushes the standard images to host under their Docker Hub
// names (DockerHubBusybox, DockerHubPython), in addition to whatever PushStandard
// pushed there. The manifests, and so the digests, are the same as under the
// sandboxd/ names.
func PushDockerHubNames(host string, imgs *Images) error {
	if imgs == nil || imgs.Busybox == nil || imgs.Python == nil {
		return errors.New("testimage: PushDockerHubNames: images missing")
	}
	if _, err := Push(host, DockerHubBusybox, imgs.Busybox); err != nil {
		return err
	}
	_, err := Push(host, DockerHubPython, imgs.Python)
	return err
}
