package apifront

import (
	"connectrpc.com/vanguard"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/sandboxd/sandboxd/internal/apierr"
)

// StrictJSON are the transcoder options of the API's JSON (REST and Connect): unknown
// fields are errors, and a body that is not valid JSON for the message (invalid UTF-8
// among it) is INVALID_ARGUMENT with reason CWSANDBOX_INVALID_REQUEST, as it is on gRPC
// (vanguard's default answered 500 UNKNOWN, and dropped unknown fields). JSON is decoded
// here and handed to the handlers as protobuf, so this codec is the only JSON decoder.
func StrictJSON() []vanguard.TranscoderOption {
	return []vanguard.TranscoderOption{
		vanguard.WithCodec(func(res vanguard.TypeResolver) vanguard.Codec {
			c := vanguard.NewJSONCodec(res)
			c.UnmarshalOptions.DiscardUnknown = false
			return strictJSON{c}
		}),
		vanguard.WithDefaultServiceOptions(vanguard.WithTargetCodecs(vanguard.CodecProto)),
	}
}

type strictJSON struct{ *vanguard.JSONCodec }

func (j strictJSON) Unmarshal(b []byte, msg proto.Message) error {
	return invalidJSON(j.JSONCodec.Unmarshal(b, msg))
}

func (j strictJSON) UnmarshalField(b []byte, msg proto.Message, field protoreflect.FieldDescriptor) error {
	return invalidJSON(j.JSONCodec.UnmarshalField(b, msg, field))
}

func invalidJSON(err error) error {
	if err == nil {
		return nil
	}
	return apierr.Invalid(apierr.InvalidRequest, "the request body is not valid JSON for this call: "+err.Error(),
		[]apierr.Violation{{Field: "body", Description: err.Error()}})
}
