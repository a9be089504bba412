# Filter for mpirun's stderr (launch/mpirun.sh): once a rank has printed mgg's own error line, drop
# Open MPI's boxed reports that only repeat that the job failed ("MPI_ABORT was invoked ...",
# "prterun has exited due to process rank ...", "... detected that one or more processes exited
# with non-zero status ..."), so the user reads one error, once. Every other line and every other
# box (a rank killed by a signal, an unknown mpirun option, ...) passes unchanged, line by line.
#
# mgg's error lines: "error: ...", "error (rank R of P): ...", "mgg.<tool>: rank R of P failed|exited|
# interrupted ...", "mgg.<tool>: error: ..." (argparse), "mgg watchdog: ...".
function is_mgg_error(line) {
  return line ~ /^error( \(rank [0-9]+ of [0-9]+\))?: / ||
         line ~ /^mgg\.[a-z_]+: rank [0-9]+ of [0-9]+ (failed|exited|interrupted)/ ||
         line ~ /^mgg\.[a-z_]+: error: / || line ~ /^mgg watchdog: /
}
function is_repeat(box) {
  return box ~ /MPI_ABORT was invoked/ || box ~ /has exited due to process rank/ ||
         box ~ /exited with non-zero status/
}
/^---------------+$/ {
  if (!open) { open = 1; box = $0 "\n"; next }
  box = box $0 "\n"; open = 0
  if (!(seen && is_repeat(box))) { printf "%s", box; fflush() }
  box = ""; next
}
open { box = box $0 "\n"; next }
{ print; fflush(); if (is_mgg_error($0)) seen = 1 }
END { if (open) printf "%s", box }
