// Package benchrank is one rank of `migctl bench`: it joins the group
// through the trainer SDK, runs a collective over every message size of a
// sweep, checks every element of the results when asked, and merges every
// rank's measurements at rank 0.
//
// Config is the benchmark, shared by every rank (the launcher hands it to
// the ranks it starts as JSON); Run runs one rank of it and returns, at rank
// 0, the merged Report. Starting rank processes and printing the report are
// the command's (cmd/migctl).
package benchrank
