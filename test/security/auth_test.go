package security

import (
	"net/http"
	"testing"
)

// TestUnauthenticatedIsRefused: no key, a wrong key, or a malformed header get 401 on
// the REST surface before anything else happens.
func TestUnauthenticatedIsRefused(t *testing.T) {
	d := needDev(t)
	for _, auth := range []string{"", "Bearer nope", "Basic Zm9vOmJhcg==", "Bearer "} {
		req, _ := http.NewRequest("GET", d.API+"/v1/sandboxes", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("Authorization %q: HTTP %d, want 401", auth, resp.StatusCode)
		}
	}
	req, _ := http.NewRequest("GET", d.API+"/v1/sandboxes", nil)
	req.Header.Set("Authorization", "Bearer "+d.KeyA)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("a valid key: HTTP %d, want 200", resp.StatusCode)
	}
}
