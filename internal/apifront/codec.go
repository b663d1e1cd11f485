package apifront

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"connectrpc.com/connect"
	"connectrpc.com/vanguard"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// TranscoderOptions are the options of every API transcoder: strict JSON (StrictJSON)
// and Unknown for what no service serves.
func TranscoderOptions() []vanguard.TranscoderOption {
	return append(StrictJSON(), vanguard.WithUnknownHandler(http.HandlerFunc(Unknown)))
}

// StrictJSON are the transcoder options of the API's JSON (REST and Connect): unknown
// fields are errors, and a body that is not valid JSON for the message (invalid UTF-8
// among it) is INVALID_ARGUMENT with reason CWSANDBOX_INVALID_REQUEST, as it is on gRPC
// (vanguard's default answered 500 UNKNOWN, and dropped unknown fields). JSON is decoded
// here and handed to the handlers as protobuf, so this codec is the only JSON decoder.
// Binary protobuf keeps ignoring unknown fields: newer clients may send fields this
// server does not know yet.
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
	if err := invalidJSON(j.JSONCodec.Unmarshal(b, msg), b, msg.ProtoReflect().Descriptor(), ""); err != nil {
		return err
	}
	markSetEmpty(b, msg)
	return nil
}

func (j strictJSON) UnmarshalField(b []byte, msg proto.Message, field protoreflect.FieldDescriptor) error {
	return invalidJSON(j.JSONCodec.UnmarshalField(b, msg, field), b, field.Message(), string(field.Name())+".")
}

// MarshalAppend also encodes the REST error bodies (google.rpc.Status): the transcoder's
// own refusals of a REST request (a query value that does not parse as its field's type)
// carry no ErrorInfo, which every INVALID_ARGUMENT of this API has.
func (j strictJSON) MarshalAppend(b []byte, msg proto.Message) ([]byte, error) {
	if st, ok := msg.(*status.Status); ok && st.GetCode() == int32(connect.CodeInvalidArgument) && !hasErrorInfo(st) {
		st = proto.CloneOf(st)
		if info, err := anypb.New(&errdetails.ErrorInfo{Reason: apierr.InvalidRequest, Domain: apierr.Domain}); err == nil {
			st.Details = append(st.Details, info)
		}
		msg = st
	}
	return j.JSONCodec.MarshalAppend(b, msg)
}

func hasErrorInfo(st *status.Status) bool {
	for _, d := range st.GetDetails() {
		var info errdetails.ErrorInfo
		if d.UnmarshalTo(&info) == nil && info.GetDomain() == apierr.Domain {
			return true
		}
	}
	return false
}

// invalidJSON turns a decoding error of b (a md under prefix) into INVALID_ARGUMENT, with a
// violation per unknown field naming its path when that is what is wrong.
func invalidJSON(err error, b []byte, md protoreflect.MessageDescriptor, prefix string) error {
	if err == nil {
		return nil
	}
	if md != nil {
		if vs := unknownFields(b, md, prefix); len(vs) > 0 {
			fields := make([]string, len(vs))
			for i, v := range vs {
				fields[i] = v.Field
			}
			return apierr.Invalid(apierr.InvalidRequest, "unknown field(s) in the request body: "+strings.Join(fields, ", "), vs)
		}
	}
	return apierr.Invalid(apierr.InvalidRequest, "the request body is not valid JSON for this call: "+err.Error(),
		[]apierr.Violation{{Field: "body", Description: err.Error()}})
}

// maxUnknownFields bounds the violations one body gets.
const maxUnknownFields = 20

// unknownFields returns a violation for each object key of the JSON document b that names
// no field of the message it stands for (proto or JSON name, as protojson accepts), with
// the key's path (proto names, [i] and ["key"] for lists and maps). It reads b token by
// token, so its memory is bounded by the nesting depth, not by b. Well-known types
// (Struct, Any, Timestamp, …) are not looked into.
func unknownFields(b []byte, md protoreflect.MessageDescriptor, prefix string) []apierr.Violation {
	w := &fieldWalker{dec: json.NewDecoder(bytes.NewReader(b))}
	w.dec.UseNumber()
	w.message(md, prefix)
	return w.vs
}

type fieldWalker struct {
	dec *json.Decoder
	vs  []apierr.Violation
	err error
}

func (w *fieldWalker) token() json.Token {
	if w.err != nil {
		return nil
	}
	t, err := w.dec.Token()
	if err != nil {
		w.err = err
		return nil
	}
	return t
}

// message walks the next value as md (an object; anything else is skipped).
func (w *fieldWalker) message(md protoreflect.MessageDescriptor, prefix string) {
	if strings.HasPrefix(string(md.FullName()), "google.protobuf.") {
		w.skip()
		return
	}
	if t := w.token(); t != json.Delim('{') {
		w.skipRest(t)
		return
	}
	for w.err == nil && w.dec.More() {
		key, _ := w.token().(string)
		fd := md.Fields().ByJSONName(key)
		if fd == nil {
			fd = md.Fields().ByName(protoreflect.Name(key))
		}
		if fd == nil {
			if len(w.vs) < maxUnknownFields {
				w.vs = append(w.vs, apierr.Violation{Field: prefix + textclip.Clip(key, 128), Description: unknownField(md, key)})
			}
			w.skip()
			continue
		}
		w.field(fd, prefix+string(fd.Name()))
	}
	w.token() // '}'
}

// field walks the next value as fd's.
func (w *fieldWalker) field(fd protoreflect.FieldDescriptor, path string) {
	switch {
	case fd.IsMap() && fd.MapValue().Message() != nil:
		if t := w.token(); t != json.Delim('{') {
			w.skipRest(t)
			return
		}
		for w.err == nil && w.dec.More() {
			key, _ := w.token().(string)
			w.message(fd.MapValue().Message(), fmt.Sprintf("%s[%q].", path, textclip.Clip(key, 128)))
		}
		w.token()
	case fd.IsList() && fd.Message() != nil:
		if t := w.token(); t != json.Delim('[') {
			w.skipRest(t)
			return
		}
		for i := 0; w.err == nil && w.dec.More(); i++ {
			w.message(fd.Message(), fmt.Sprintf("%s[%d].", path, i))
		}
		w.token()
	case !fd.IsMap() && !fd.IsList() && fd.Message() != nil:
		w.message(fd.Message(), path+".")
	default:
		w.skip()
	}
}

// skip skips the next value.
func (w *fieldWalker) skip() { w.skipRest(w.token()) }

// skipRest skips the rest of the value t began.
func (w *fieldWalker) skipRest(t json.Token) {
	if t != json.Delim('{') && t != json.Delim('[') {
		return
	}
	for depth := 1; depth > 0 && w.err == nil; {
		switch w.token() {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
}

// unknownField describes key, an unknown field of md, with the field it may have meant.
func unknownField(md protoreflect.MessageDescriptor, key string) string {
	best, bestD := "", 3 // suggest only within two edits
	for i := range md.Fields().Len() {
		name := md.Fields().Get(i).JSONName()
		if d := editDistance(strings.ToLower(key), strings.ToLower(name)); d < bestD {
			best, bestD = name, d
		}
	}
	desc := "is not a field of " + string(md.FullName())
	switch n := md.Fields().Len(); {
	case best != "":
		desc += fmt.Sprintf(" (did you mean %q?)", best)
	case n > 0 && n <= 12:
		names := make([]string, n)
		for i := range n {
			names[i] = md.Fields().Get(i).JSONName()
		}
		desc += " (its fields: " + strings.Join(names, ", ") + ")"
	}
	return desc
}

// editDistance is the Levenshtein distance of a and b (bytes; short field names).
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return max(len(a), len(b))
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
