// A flag, key or short value in a table cell (`--accept-new-host-keys`, `--lock-wait SECONDS`,
// `cluster.fence`) stays on one line: browsers may break after a hyphen, which showed flags as
// "- -json" in narrow columns. Longer code (a message, a command line) still wraps. document$ is
// mkdocs-material's page observable: it fires on the first load and on every instant navigation.
document$.subscribe(function () {
  document.querySelectorAll(".md-typeset td code").forEach(function (code) {
    if (code.textContent.length <= 32) code.classList.add("unbroken");
  });
});
