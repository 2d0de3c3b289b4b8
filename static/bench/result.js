// A saved benchmark, read-only: the same table, charts and card as the live page, from the stored numbers.
import { Charts, download, drawSummary, resultCard } from "./view.js";

const result = JSON.parse(document.getElementById("result-data").textContent);
drawSummary(document.getElementById("summary"), result.lanes);
new Charts(document.getElementById("charts"), result.lanes).update(result.lanes);
document.getElementById("card").addEventListener("click", () => resultCard(result.title, result.lanes).toBlob((blob) => download(`bench-${result.slug}.png`, blob)));
