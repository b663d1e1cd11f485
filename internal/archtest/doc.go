// Package archtest states the dependency rules of sandboxd's package layout and checks
// them in its tests, in the manner of Tailscale's tstest/deptest: `go list -deps` gives
// the import graph of the module's packages (without their tests), and each rule names
// the packages it constrains and what they must never reach through it. A main package
// whose subcommands differ in what they may reach (cmd/sandboxd: `dev` may serve test
// images, `runner` may not) is checked one level finer, function by function.
//
// The rules and the allow-list of today's violations are in rules_test.go. An entry of
// the allow-list names the importer, the imported package and the issue-17 step that
// removes it; a new violation fails the test, and so does an entry that no longer
// matches a violation, so the list only shrinks.
//
// The package has no code outside its tests: nothing imports it.
package archtest
