package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/compose"
)

// CreateSandboxFromFile creates a sandbox from a Compose file: package compose translates
// the file into the spec a CreateSandbox would carry (one container per service), which
// then takes CreateSandbox's path (request_id, shape, policy, placement, runner). The key
// was checked from the headers before the body was read (apifront); the file is bounded
// (compose.MaxContentsBytes) and parsed without the server's files or environment.
//
// A request_id names one request: replaying it with other bytes (whitespace included) or
// other options is CWSANDBOX_REQUEST_ID_CONFLICT, as the official client documents.
func (s *Server) CreateSandboxFromFile(ctx context.Context, req *connect.Request[sandboxv1.CreateSandboxFromFileRequest]) (*connect.Response[sandboxv1.Sandbox], error) {
	digest := fileRequestDigest(req.Msg) // build_context_objects by reference, as sent
	if err := s.resolveBuildContextObjects(ctx, req.Msg); err != nil {
		return nil, err
	}
	res, err := compose.Convert(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	var builds map[string]string
	if len(res.Builds) > 0 {
		// Built before the create's request_id is looked at: a replay finds the same
		// builds done (their request_ids are their inputs') and creates nothing new.
		built, err := s.composeBuilds(ctx, res)
		if err != nil {
			return nil, err
		}
		builds = built.ids
		if built.engine != nil {
			// Container-engine control: the file again, its built services naming their
			// images (the engine is handed them by the runner like any other).
			if res, err = compose.Convert(ctx, engineBuilt(req.Msg, built.engine)); err != nil {
				return nil, err
			}
		}
	}
	out, err := s.create(ctx, createArgs{spec: res.Spec, requestID: req.Msg.GetRequestId(), requestDigest: digest, displayName: req.Msg.GetDisplayName(),
		displayNameField: "display_name", adjust: res.Extra.Apply, engine: res.Extra.Engine, builds: builds})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

// fileRequestDigest identifies a CreateSandboxFromFile request but for its request_id:
// the file's bytes as sent and every option (deterministic encoding, so equal requests
// give equal digests).
func fileRequestDigest(m *sandboxv1.CreateSandboxFromFileRequest) string {
	c := proto.CloneOf(m)
	c.RequestId = ""
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	if err != nil {
		// Only an invalid message fails to encode, and a decoded request is valid; fall
		// back to the file's bytes, which still tell two files apart.
		b = m.GetContents()
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}
