-- Sandbox templates (issue 22; SandboxTemplateService). Organization-scoped, soft deleted:
-- delete_time is NULL until deleted. spec is the PartialSandboxSpec as binary protobuf,
-- attachments the google.protobuf.Struct as JSON text. request_digest identifies the
-- CreateSandboxTemplate request that created it (a repeated request_id with another
-- request is a conflict). A display name is unique among an organization's templates
-- that are not deleted: a deleted template frees its name.
-- Like the sandbox index it is the gateway's, so no foreign key to organizations.
-- Keep in step with ../sqlite/0011_templates.sql.
CREATE TABLE templates (
    id             text        NOT NULL,
    org_id         text        NOT NULL,
    display_name   text        NOT NULL,
    spec           bytea       NOT NULL,
    attachments    text,
    revision       bigint      NOT NULL,
    create_time    timestamptz NOT NULL,
    update_time    timestamptz NOT NULL,
    delete_time    timestamptz,
    create_user_id text        NOT NULL DEFAULT '',
    request_id     text,
    request_digest text        NOT NULL DEFAULT '',
    CONSTRAINT templates_pkey PRIMARY KEY (id)
);
CREATE UNIQUE INDEX templates_display_name_key ON templates (org_id, display_name) WHERE delete_time IS NULL;
CREATE UNIQUE INDEX templates_request_id_key ON templates (org_id, request_id) WHERE request_id IS NOT NULL;
CREATE INDEX templates_org_created ON templates (org_id, create_time, id);

-- The template a sandbox was created from ('' and 0: none).
ALTER TABLE sandboxes ADD COLUMN source_template_id text NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN source_template_revision bigint NOT NULL DEFAULT 0;
