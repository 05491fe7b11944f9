// Original prose written for moeserve (no third-party text), so that the random models'
// tokenizers learn ordinary English words, numbers, punctuation and code-like fragments.
#include "cli/make_model_corpus.h"

namespace moeserve::cli {

const char kMakeModelCorpus[] = R"corpus(
The river ran low that summer, and the mill at the edge of the town stood quiet for the first
time in forty years. Children walked along the dry stones where the water had been, looking for
coins and old bottles, and the miller sat on his step each morning and watched the sky.
"It will come back," he said to anyone who asked. "The river always comes back."
In the town there were three bakers, two smiths, a school with one teacher, and a library that
opened on Tuesdays and Saturdays. The teacher, whose name was Anna, taught reading in the
morning and numbers in the afternoon. She wrote on the board: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10.
Then she wrote: 12 + 30 = 42, and 100 - 58 = 42, and asked the children why the answer was the
same. Nobody knew, so she told them a story about a number that liked to hide in other numbers.
When autumn came the rain returned. First a little, then a great deal, until the river filled
its banks and the wheel of the mill turned again. The miller laughed and said nothing at all,
because he had already said it. The bakers made bread from the new flour, and the whole town
smelled of it for a week.
A machine that reads a sentence does not see words. It sees numbers, one for each piece of the
text, and it learns which pieces tend to follow which. Given "the river always comes", it
should guess "back" more often than "forward". Given "1, 2, 3," it should guess "4". This is
the whole trick, repeated a very great number of times, with a very great number of pieces.
The pieces are chosen by counting. Start with single bytes. Find the pair that appears most
often and join it into one piece. Count again, join again, and keep going until there are
enough pieces. Common words become single pieces; rare words stay split into parts.
Questions and answers:
Q: What is the capital of the small country in the story?
A: The story does not say. It is about a town, not a country.
Q: How many bakers were there?
A: There were three bakers in the town.
Q: Why did the wheel stop turning?
A: Because the river ran low during the dry summer.
Some people keep lists. A list of things to do on Monday: wash the windows, mend the fence,
write to my sister, buy salt, sugar, flour and oil. A list of things to do on Friday: rest.
Others keep accounts: paid 12.50 for nails, 3.75 for string, 120.00 for a new saw.
def count_pairs(words):
    counts = {}
    for word in words:
        for left, right in zip(word, word[1:]):
            counts[(left, right)] = counts.get((left, right), 0) + 1
    return counts
for (int i = 0; i < n; ++i) { sum += values[i]; }
if (x > 0 && y > 0) return x * y; else return -1;
{"name": "moeserve", "layers": 48, "experts": 512, "active": 10, "hidden": 2048}
The weather report for the week: Monday, cloudy with a light wind from the west. Tuesday,
rain in the morning, clearing by noon. Wednesday, bright and cold. Thursday and Friday, warm
for the season, with a chance of storms in the evening. The weekend will be dry.
Anna's students wrote letters at the end of the year. "Dear teacher," one began, "thank you
for the numbers and the stories. I liked the one about the hiding number best. I still do not
know where it hides, but I think it is somewhere in 42." Another wrote only: "I can read now."
She kept every letter in a box under her desk, and on quiet evenings she read them again.
People have always told stories to remember what matters: where the water is, which berries are
safe to eat, who can be trusted, and what happened the last time the river ran low. A good story
is easy to carry and hard to forget. It changes a little each time it is told, and yet it stays
the same, the way a river is never the same water and is always the same river.
The engine reads the weights once for every token it writes. If the weights are large and the
memory is slow, the engine waits. So the people who build such engines count bytes the way the
miller counted sacks of flour: how many come in, how many go out, and where the time is lost.
Every morning the market opened at seven. There were apples, pears, plums and late cherries;
eggs in baskets; cheese wrapped in cloth; fish on ice that melted by noon. Prices were written
in chalk: apples 2 for 1, eggs 6 for 3, cheese 4 a piece. The sellers called out to each other
across the square, and the buyers argued, and in the end everyone went home with something.
)corpus";

}  // namespace moeserve::cli
