package controlplane

import "testing"

// TestDownloadSlots: one runner gets MaxDownloadsPerRunner downloads in flight, not more;
// a slot is free again when a download ends; other runners are not affected.
func TestDownloadSlots(t *testing.T) {
	var d downloadSlots
	for i := range MaxDownloadsPerRunner {
		if !d.acquire("o/r1") {
			t.Fatalf("download %d of r1 refused", i+1)
		}
	}
	if d.acquire("o/r1") {
		t.Fatalf("download %d of r1 admitted", MaxDownloadsPerRunner+1)
	}
	if !d.acquire("o/r2") {
		t.Fatal("r2 refused because of r1's downloads")
	}
	d.release("o/r1")
	if !d.acquire("o/r1") {
		t.Fatal("r1 refused after one of its downloads ended")
	}
	for range MaxDownloadsPerRunner {
		d.release("o/r1")
	}
	d.release("o/r2")
	if len(d.active) != 0 {
		t.Fatalf("slots left after every download ended: %v", d.active)
	}
}
