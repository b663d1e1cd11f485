package s3

import (
	"strings"
	"testing"
)

func TestConfigValidate(t *testing.T) {
	good := Config{Endpoint: "127.0.0.1:8333", Bucket: "sandboxd-blobs", AccessKey: "a", SecretKey: "s", PathStyle: true, Insecure: true}
	if err := good.Validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	for _, ok := range []func(*Config){
		func(c *Config) { c.Endpoint = "s3.us-east-1.amazonaws.com"; c.Insecure = false },
		func(c *Config) { c.Endpoint = "[::1]:9000" },
		func(c *Config) { c.Region = "us-east-1" },
		func(c *Config) { c.Insecure = false; c.CAFile = "/etc/ca.pem" },
		func(c *Config) { c.PartSize = 5 << 20 },
	} {
		c := good
		ok(&c)
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
	for want, bad := range map[string]func(*Config){
		"endpoint: required": func(c *Config) { c.Endpoint = "" },
		"no scheme":          func(c *Config) { c.Endpoint = "http://127.0.0.1:8333" },
		"no scheme or path":  func(c *Config) { c.Endpoint = "host/path" },
		"bad port":           func(c *Config) { c.Endpoint = "host:99999" },
		"bucket \"\"":        func(c *Config) { c.Bucket = "" },
		"bucket \"UP\"":      func(c *Config) { c.Bucket = "UP" },
		"bucket \"a..b\"":    func(c *Config) { c.Bucket = "a..b" },
		"region":             func(c *Config) { c.Region = "us east" },
		"secret key":         func(c *Config) { c.SecretKey = "" },
		"ca file":            func(c *Config) { c.CAFile = "/ca.pem" },
		"part size":          func(c *Config) { c.PartSize = 1 << 20 },
	} {
		c := good
		bad(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: %v, want an error with %q", c, err, want)
		}
	}
}
