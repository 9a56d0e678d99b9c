# plot_loss.gp - the loss curve of a train_tiny run (results/loss.tsv -> results/loss.png):
#     gnuplot -e "dir='tools/train_tiny/results'" tools/train_tiny/plot_loss.gp
if (!exists("dir")) dir = "tools/train_tiny/results"
set terminal pngcairo size 800,450 font ",10"
set output dir."/loss.png"
set datafile separator "\t"
set key autotitle columnhead top right
set title "train\\_tiny: qwen3moe 6 x 32 experts, top-4, 24.3 M parameters"
set xlabel "tokens seen (M)"
set ylabel "cross-entropy (nats/token)"
set y2label "router aux loss"
set y2tics
set ytics nomirror
set yrange [1:8]
set grid
plot dir."/loss.tsv" using ($3/1e6):5 with lines lw 2 title "train loss", \
     ""              using ($3/1e6):7 with points pt 7 ps 1.2 title "held-out loss", \
     ""              using ($3/1e6):6 axes x1y2 with lines dt 2 title "aux loss"
