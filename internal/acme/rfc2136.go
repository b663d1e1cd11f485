package acme

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/libdns/libdns"
	"github.com/miekg/dns"
)

// RFC2136 writes DNS records with dynamic updates (RFC 2136), signed with TSIG (RFC
// 8945) when a key is set. BIND, Knot, PowerDNS and most DNS hosting speak it, so one
// provider covers them without an API client per vendor. It implements the libdns
// interfaces certmagic's DNS-01 solver needs.
type RFC2136 struct {
	Server string // primary name server, host:port
	// TSIG key: name, algorithm (dns.HmacSHA256 when empty) and base64 secret; no
	// signature when KeyName is empty.
	KeyName, KeyAlgorithm, KeySecret string
	Timeout                          time.Duration // per update; 0: 10 s
}

// AppendRecords adds recs to zone.
func (p *RFC2136) AppendRecords(ctx context.Context, zone string, recs []libdns.Record) ([]libdns.Record, error) {
	rrs, err := toRRs(zone, recs)
	if err != nil {
		return nil, err
	}
	m := new(dns.Msg)
	m.SetUpdate(dns.Fqdn(zone))
	m.Insert(rrs)
	if err := p.send(ctx, m); err != nil {
		return nil, fmt.Errorf("rfc2136: add %d records to %s: %w", len(rrs), zone, err)
	}
	return recs, nil
}

// DeleteRecords removes recs (matched by name, type and data) from zone.
func (p *RFC2136) DeleteRecords(ctx context.Context, zone string, recs []libdns.Record) ([]libdns.Record, error) {
	rrs, err := toRRs(zone, recs)
	if err != nil {
		return nil, err
	}
	m := new(dns.Msg)
	m.SetUpdate(dns.Fqdn(zone))
	m.Remove(rrs)
	if err := p.send(ctx, m); err != nil {
		return nil, fmt.Errorf("rfc2136: delete %d records from %s: %w", len(rrs), zone, err)
	}
	return recs, nil
}

func (p *RFC2136) send(ctx context.Context, m *dns.Msg) error {
	c := &dns.Client{Net: "tcp", Timeout: p.Timeout}
	if c.Timeout <= 0 {
		c.Timeout = 10 * time.Second
	}
	if p.KeyName != "" {
		name, alg := dns.Fqdn(p.KeyName), p.KeyAlgorithm
		if alg == "" {
			alg = dns.HmacSHA256
		}
		c.TsigSecret = map[string]string{name: p.KeySecret}
		m.SetTsig(name, dns.Fqdn(alg), 300, time.Now().Unix())
	}
	r, _, err := c.ExchangeContext(ctx, m, p.Server)
	if err != nil {
		return err
	}
	if r.Rcode != dns.RcodeSuccess {
		return fmt.Errorf("server %s answered %s", p.Server, dns.RcodeToString[r.Rcode])
	}
	return nil
}

// toRRs turns libdns records, named relative to zone, into wire records.
func toRRs(zone string, recs []libdns.Record) ([]dns.RR, error) {
	out := make([]dns.RR, 0, len(recs))
	for _, rec := range recs {
		r := rec.RR()
		name := libdns.AbsoluteName(r.Name, zone)
		ttl := uint32(r.TTL / time.Second)
		hdr := dns.RR_Header{Name: dns.Fqdn(name), Class: dns.ClassINET, Ttl: ttl}
		switch r.Type {
		case "TXT": // zone-file syntax would need quoting; the text goes as is
			hdr.Rrtype = dns.TypeTXT
			out = append(out, &dns.TXT{Hdr: hdr, Txt: splitTXT(r.Data)})
		case "":
			return nil, errors.New("rfc2136: record without a type")
		default:
			rr, err := dns.NewRR(fmt.Sprintf("%s %d IN %s %s", hdr.Name, ttl, r.Type, r.Data))
			if err != nil {
				return nil, fmt.Errorf("rfc2136: record %s %s: %w", name, r.Type, err)
			}
			out = append(out, rr)
		}
	}
	return out, nil
}

// splitTXT cuts text into the 255-byte strings a TXT record is made of.
func splitTXT(s string) []string {
	var parts []string
	for len(s) > 255 {
		parts = append(parts, s[:255])
		s = s[255:]
	}
	return append(parts, s)
}

// trimDot drops a trailing dot.
func trimDot(s string) string { return strings.TrimSuffix(s, ".") }
