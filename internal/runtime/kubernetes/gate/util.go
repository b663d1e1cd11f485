package gate

import (
	"encoding/json"
	"encoding/pem"
	"errors"
	"os"
)

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

// readCertDER reads the first CERTIFICATE block of a PEM file.
func readCertDER(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return nil, errors.New(path + ": no certificate")
		}
		if blk.Type == "CERTIFICATE" {
			return blk.Bytes, nil
		}
	}
}
