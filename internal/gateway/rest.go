package gateway

import (
	"fmt"

	"connectrpc.com/vanguard"

	"github.com/sandboxd/sandboxd/internal/apifront"
)

// restTranscoder serves services over gRPC, gRPC-Web and Connect as they are, and over
// REST/JSON by their google.api.http annotations (e.g. GET /v1/sandboxes/{sandbox_id}),
// so curl works as well as the official clients.
func restTranscoder(services ...*vanguard.Service) (*vanguard.Transcoder, error) {
	t, err := vanguard.NewTranscoder(services, apifront.TranscoderOptions()...)
	if err != nil {
		return nil, fmt.Errorf("REST transcoding: %w", err)
	}
	return t, nil
}
