package sandbox

import (
	"context"
	"errors"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
)

// Registered volumes (VolumeService): organization-scoped volumes that outlive sandboxes,
// mounted by ID (SandboxVolume.volume_id). On sandboxd a CLUSTER_LOCAL volume is held by
// one runner (PvcVolumeSource: runner_id, namespace "default", claim_name naming it there)
// and sandboxes mounting it are placed there. Writes need the SANDBOX_ADMIN role. The
// methods return the wire Volume; a missing one is ErrVolumeNotFound.

// VolumeSource is where a new volume lives.
type VolumeSource struct {
	RunnerID  string
	Namespace string // "" = "default"
	ClaimName string
	SubPath   string // a root inside the volume ("" = its root)
	// Size is the volume's size, a quantity such as "10Gi" (16Mi to 1Ti; "" = the
	// runner's default, 10Gi on a local runner): VolumeSpec.size, a sandboxd extension.
	// It counts against the organization's max_volume_bytes quota.
	Size string
}

// CreateVolume registers volume id (VALIDATING; poll GetVolume for READY or ERROR).
// Transient failures are retried with one request ID.
func (c *Client) CreateVolume(ctx context.Context, id string, src VolumeSource, readOnly bool, description string) (*sandboxv1.Volume, error) {
	if id == "" {
		return nil, errors.New("sandbox: CreateVolume needs a volume ID")
	}
	if src.Namespace == "" {
		src.Namespace = "default"
	}
	req := &sandboxv1.CreateVolumeRequest{RequestId: uuid.NewString(), Volume: &sandboxv1.Volume{VolumeId: id, Spec: &sandboxv1.VolumeSpec{
		Source:   &sandboxv1.VolumeSpec_Pvc{Pvc: &sandboxv1.PvcVolumeSource{RunnerId: src.RunnerID, Namespace: src.Namespace, ClaimName: src.ClaimName, SubPath: src.SubPath}},
		ReadOnly: readOnly, Description: description, Size: src.Size}}}
	var out *sandboxv1.Volume
	err := retry(ctx, retryBudget, func(ctx context.Context) error {
		res, err := c.vols.CreateVolume(ctx, connect.NewRequest(req))
		if err == nil {
			out = res.Msg
		}
		return fromRPC(err)
	})
	return out, err
}

// GetVolume returns volume id.
func (c *Client) GetVolume(ctx context.Context, id string) (*sandboxv1.Volume, error) {
	var out *sandboxv1.Volume
	err := retry(ctx, retryBudget, func(ctx context.Context) error {
		res, err := c.vols.GetVolume(ctx, connect.NewRequest(&sandboxv1.GetVolumeRequest{VolumeId: id}))
		if err == nil {
			out = res.Msg
		}
		return fromRPC(err)
	})
	return out, err
}

// ListVolumes returns the organization's volumes, following page tokens.
func (c *Client) ListVolumes(ctx context.Context) ([]*sandboxv1.Volume, error) {
	ctx, cancel := withTimeout(ctx, listTimeout)
	defer cancel()
	return collectPages(ctx, maxListPages, func(ctx context.Context, token string) ([]*sandboxv1.Volume, string, error) {
		var res *connect.Response[sandboxv1.ListVolumesResponse]
		err := retry(ctx, retryBudget, func(ctx context.Context) error {
			var err error
			res, err = c.vols.ListVolumes(ctx, connect.NewRequest(&sandboxv1.ListVolumesRequest{PageToken: token}))
			return fromRPC(err)
		})
		if err != nil {
			return nil, "", err
		}
		return res.Msg.GetVolumes(), res.Msg.GetNextPageToken(), nil
	})
}

// UpdateVolumeDescription sets volume id's description (the one updatable field).
func (c *Client) UpdateVolumeDescription(ctx context.Context, id, description string) (*sandboxv1.Volume, error) {
	var out *sandboxv1.Volume
	err := retry(ctx, retryBudget, func(ctx context.Context) error {
		res, err := c.vols.UpdateVolume(ctx, connect.NewRequest(&sandboxv1.UpdateVolumeRequest{VolumeId: id,
			Volume:     &sandboxv1.Volume{VolumeId: id, Spec: &sandboxv1.VolumeSpec{Description: description}},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"spec.description"}}}))
		if err == nil {
			out = res.Msg
		}
		return fromRPC(err)
	})
	return out, err
}

// GrowVolume grows volume id to size (a quantity such as "20Gi"; sandboxd extension,
// update_mask spec.size): admitted against max_volume_bytes (ReasonQuotaExceeded), never
// smaller than it is. A runner that cannot grow it while sandboxes mount it refuses
// (ReasonVolumeInUse).
func (c *Client) GrowVolume(ctx context.Context, id, size string) (*sandboxv1.Volume, error) {
	var out *sandboxv1.Volume
	err := retry(ctx, retryBudget, func(ctx context.Context) error {
		res, err := c.vols.UpdateVolume(ctx, connect.NewRequest(&sandboxv1.UpdateVolumeRequest{VolumeId: id,
			Volume:     &sandboxv1.Volume{VolumeId: id, Spec: &sandboxv1.VolumeSpec{Size: size}},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"spec.size"}}}))
		if err == nil {
			out = res.Msg
		}
		return fromRPC(err)
	})
	return out, err
}

// DeleteVolume deletes volume id and its data; while live sandboxes mount it the server
// refuses (ReasonVolumeInUse) unless force. allowMissing: a missing one is no error.
func (c *Client) DeleteVolume(ctx context.Context, id string, allowMissing, force bool) error {
	attempts := 0
	return retry(ctx, retryBudget, func(ctx context.Context) error {
		attempts++
		_, err := c.vols.DeleteVolume(ctx, connect.NewRequest(&sandboxv1.DeleteVolumeRequest{VolumeId: id, AllowMissing: allowMissing, Force: force}))
		err = fromRPC(err)
		if err != nil && attempts > 1 && errors.Is(err, ErrVolumeNotFound) {
			return nil // an earlier attempt whose answer was lost deleted it
		}
		return err
	})
}

// ValidateVolume has the volume's runner check it again and returns the outcome.
func (c *Client) ValidateVolume(ctx context.Context, id string) (*sandboxv1.Volume, error) {
	var out *sandboxv1.Volume
	err := retry(ctx, retryBudget, func(ctx context.Context) error {
		res, err := c.vols.ValidateVolume(ctx, connect.NewRequest(&sandboxv1.ValidateVolumeRequest{VolumeId: id}))
		if err == nil {
			out = res.Msg
		}
		return fromRPC(err)
	})
	return out, err
}
