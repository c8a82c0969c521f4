module metainfer.local/pause

go 1.26.0
