package s3

// StagingOf is stagingOf for the tests of package s3_test.
var StagingOf = stagingOf
