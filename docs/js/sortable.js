// Click a table header to sort by that column (numbers numerically); click again to reverse.
document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("article table").forEach((table) => {
    table.querySelectorAll("thead th").forEach((th, column) => {
      th.style.cursor = "pointer";
      th.addEventListener("click", () => {
        const body = table.tBodies[0];
        const rows = Array.from(body.rows);
        const ascending = th.dataset.order !== "asc";
        const key = (row) => {
          const tagged = row.cells[column].querySelector("[data-sort]");  // e.g. sizes: bytes behind "16.8 MiB"
          const text = (tagged ? tagged.dataset.sort : row.cells[column].innerText).replace(/,/g, "").trim();
          const number = parseFloat(text);
          return Number.isNaN(number) ? text : number;
        };
        rows.sort((a, b) => (key(a) > key(b) ? 1 : key(a) < key(b) ? -1 : 0) * (ascending ? 1 : -1));
        th.dataset.order = ascending ? "asc" : "desc";
        rows.forEach((row) => body.appendChild(row));
      });
    });
  });
});
