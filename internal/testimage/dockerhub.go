package testimage

import (
	"context"
	"errors"
)

// Docker Hub names of the standard images, as an official client writes them
// ("python:3.11" is docker.io/library/python:3.11). A registry holding these,
// configured as the mirror for docker.io, serves such references locally.
const (
	DockerHubBusybox = "library/busybox:latest"
	DockerHubPython  = "library/python:3.11"
	DockerHubRedis   = "library/redis:7"
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

// ServeDockerHub serves the standard images on a registry listening on listen (empty:
// loopback) under their own names and Docker Hub's, to be configured as the docker.io
// mirror: `sandboxd dev` does (only it), and the multi-cluster test bed for its runners.
// It returns ErrNoTestImages when the tarballs are missing.
func ServeDockerHub(ctx context.Context, listen string) (host string, stop func(), err error) {
	imgs, err := StandardImages()
	if err != nil {
		return "", nil, err
	}
	host, stop, err = StartRegistryWith(ctx, RegistryOptions{Listen: listen})
	if err != nil {
		return "", nil, err
	}
	if err := PushStandard(host, imgs); err != nil {
		stop()
		return "", nil, err
	}
	if err := PushDockerHubNames(host, imgs); err != nil {
		stop()
		return "", nil, err
	}
	// The redis image is optional (only the Compose tests use it): served when built.
	switch redis, err := RedisImage(); {
	case err == nil:
		if _, err := Push(host, Redis, redis); err != nil {
			stop()
			return "", nil, err
		}
		if _, err := Push(host, DockerHubRedis, redis); err != nil {
			stop()
			return "", nil, err
		}
	case !errors.Is(err, ErrNoTestImages):
		stop()
		return "", nil, err
	}
	return host, stop, nil
}
