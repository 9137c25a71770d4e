"""Pictures of a trace: matplotlib figures (`figures`) and the self-contained HTML viewer (`html`)."""
