package controlplane

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/store"
)

func (s *Service) CreateApiKey(ctx context.Context, req *connect.Request[controlplanev1.CreateApiKeyRequest]) (*connect.Response[controlplanev1.CreateApiKeyResponse], error) {
	var vs violations
	checkDisplayName(&vs, "display_name", req.Msg.GetDisplayName())
	role := auth.RoleUser
	switch req.Msg.GetRole() {
	case controlplanev1.Role_ROLE_UNSPECIFIED, controlplanev1.Role_SANDBOX_USER:
	case controlplanev1.Role_SANDBOX_ADMIN:
		role = auth.RoleAdmin
	default:
		vs.add("role", "must be SANDBOX_ADMIN or SANDBOX_USER (got %d)", int32(req.Msg.GetRole()))
	}
	if err := vs.err("invalid API key"); err != nil {
		return nil, err
	}
	org := principal(ctx).Org
	secret, rec, err := auth.IssueKey(ctx, s.st, org, role, req.Msg.GetDisplayName())
	if err != nil {
		return nil, apierr.Newf(apierr.ControlPlaneUnavailable, "%v", err)
	}
	s.log.Info("API key created", "org", org, "key", rec.ID, "role", role, "by", principal(ctx).KeyID)
	return connect.NewResponse(&controlplanev1.CreateApiKeyResponse{ApiKey: keyProto(rec), Secret: secret}), nil
}

func (s *Service) ListApiKeys(ctx context.Context, req *connect.Request[controlplanev1.ListApiKeysRequest]) (*connect.Response[controlplanev1.ListApiKeysResponse], error) {
	size, err := apierr.PageSize(req.Msg.GetPageSize(), store.DefaultPageSize, store.MaxPageSize)
	if err != nil {
		return nil, err
	}
	start := 0
	if t := req.Msg.GetPageToken(); t != "" {
		b, err := base64.RawURLEncoding.DecodeString(t)
		n, aerr := strconv.Atoi(string(b))
		if err != nil || aerr != nil || n < 0 {
			return nil, apierr.Invalid(apierr.InvalidRequest, "invalid page_token", []apierr.Violation{{Field: "page_token", Description: "is not a token this list returned"}})
		}
		start = n
	}
	keys, err := s.st.APIKeys().List(ctx, principal(ctx).Org)
	if err != nil {
		return nil, apierr.Newf(apierr.ControlPlaneUnavailable, "list API keys: %v", err)
	}
	if start > len(keys) {
		return nil, apierr.Invalid(apierr.InvalidRequest, "invalid page_token", []apierr.Violation{{Field: "page_token", Description: "is not a token this list returned"}})
	}
	out := &controlplanev1.ListApiKeysResponse{}
	for i := start; i < len(keys) && i < start+size; i++ {
		out.ApiKeys = append(out.ApiKeys, keyProto(keys[i]))
	}
	if start+size < len(keys) {
		out.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(strconv.Itoa(start + size)))
	}
	return connect.NewResponse(out), nil
}

func (s *Service) RevokeApiKey(ctx context.Context, req *connect.Request[controlplanev1.RevokeApiKeyRequest]) (*connect.Response[controlplanev1.ApiKey], error) {
	id := req.Msg.GetKeyId()
	if id == "" {
		return nil, apierr.Invalid(apierr.InvalidRequest, "key_id is required", []apierr.Violation{{Field: "key_id", Description: "is required"}})
	}
	org := principal(ctx).Org
	rec, err := s.st.APIKeys().Revoke(ctx, org, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, apierr.New(apierr.APIKeyNotFound, fmt.Sprintf("API key %s not found", id), map[string]string{"key_id": id})
	}
	if err != nil {
		return nil, apierr.Newf(apierr.ControlPlaneUnavailable, "revoke API key: %v", err)
	}
	s.log.Info("API key revoked", "org", org, "key", id, "by", principal(ctx).KeyID)
	return connect.NewResponse(keyProto(rec)), nil
}

func keyProto(k store.APIKey) *controlplanev1.ApiKey {
	out := &controlplanev1.ApiKey{KeyId: k.ID, DisplayName: k.Name, Role: controlplanev1.Role_SANDBOX_USER, CreateTime: timestamppb.New(k.CreatedAt)}
	if k.Role == store.RoleAdmin {
		out.Role = controlplanev1.Role_SANDBOX_ADMIN
	}
	if k.RevokedAt != nil {
		out.RevokeTime = timestamppb.New(*k.RevokedAt)
	}
	if k.LastUsedAt != nil {
		out.LastUsedTime = timestamppb.New(*k.LastUsedAt)
	}
	return out
}
