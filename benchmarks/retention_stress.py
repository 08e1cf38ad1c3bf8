"""More conversations for ``retention.py``, each stressing compaction in its own way.

1. ``corrections``: a customer corrects values she gave (an order number, a colour and an
   address early on, so that value and correction are summarized together; a date and a
   time slot near the end, so that the old value is summarized and the correction stays
   in the preserved tail; and the old address named again in the tail as superseded);
2. ``long``: a trip planned over 47 turns, compacted again and again (summaries of
   summaries), six facts planted at the start and four more spread over the middle;
3. ``japanese``: the support chat's story in Japanese (names, places, a colour and a
   contact channel without digits or Latin letters).

A fact with ``superseded`` spellings was corrected: an answer that gives an old value and
not the current one presents the superseded value as current.
"""

from __future__ import annotations

from retention_data import Conversation, Fact, Turn

CORRECTIONS = Conversation(
    name="corrections",
    instructions=(
        "You are the delivery assistant of Birchline Furniture. Help customers with their "
        "orders and deliveries. Be friendly and concise."
    ),
    turns=(
        Turn(
            "Hello! I'd like to arrange the delivery of the sofa I bought last week. My name "
            "is Priya Okonkwo-Hale.",
            "Hello Priya, thanks for getting in touch, and congratulations on the new sofa. "
            "I'll be glad to set up the delivery with you. Could you give me the order "
            "number from your confirmation email, so I can find the right order?",
        ),
        Turn(
            "Sure, it's BL-40621.",
            "Thank you. Before I book anything, could you tell me which item we are "
            "delivering and where it should go? I'll check the details against the order as "
            "we go along.",
        ),
        Turn(
            "Oh wait, sorry, I read that off the wrong email: BL-40621 was my old order from "
            "two years ago. The sofa is order BL-73318.",
            "No problem at all, that happens a lot with similar emails. I've set the old "
            "order aside and opened the right one. Which sofa is it, and where should it go?",
        ),
        Turn(
            "It's the Tamsin three-seater in slate grey. Please deliver it to 22 Alder Road, "
            "Bristol, BS6 4QR.",
            "Lovely choice, the Tamsin is one of our most comfortable sofas. I've noted the "
            "address. Which day would suit you for the delivery? We deliver Monday to "
            "Saturday, and you can pick a slot in the first or the second half of the day.",
        ),
        Turn(
            "March 14 would be ideal, in the morning slot if possible.",
            "That works: the morning slot runs from 8 am to 12 noon, and the driver calls "
            "about 30 minutes before arriving. Is there anything about the access to your "
            "home we should know, such as stairs, a lift or parking restrictions?",
        ),
        Turn(
            "We're on the third floor and there's no lift, I hope that's not a problem.",
            "Not at all. Our crews are two people for sofas, and carrying up a few flights of "
            "stairs is part of the service at no extra charge. They'll measure the stairwell "
            "turns before bringing the sofa up, just in case.",
        ),
        Turn(
            "Also, I've changed my mind about the colour: I saw the ochre one in the showroom "
            "on Saturday and I love it. Can we switch to ochre instead of the grey?",
            "Of course. The Tamsin in ochre is in stock and costs the same, so the switch "
            "doesn't change the price or the delivery date. I've updated the order, and "
            "you'll get a new confirmation email within the hour.",
        ),
        Turn(
            "Thank you! Is the ochre fabric easy to clean? We have a toddler.",
            "It's a performance weave with a stain-resistant finish, so most spills lift off "
            "with a damp cloth if you get to them quickly. For anything stubborn, a mild "
            "soap solution works well. Avoid bleach and don't rub too hard.",
        ),
        Turn(
            "One more change, sorry: we're moving flats before the delivery, so please bring "
            "it to our new place at 9 Canal Street, Bath, BA2 4JX instead of the Bristol "
            "address.",
            "No need to apologise, moves are busy times. I've changed the delivery address "
            "on the order, and the driver's route sheet will use the new one. Congratulations "
            "on the new flat!",
        ),
        Turn(
            "Thanks! Can the crew take the old sofa away as well?",
            "Yes, we offer removal of one old sofa for £35, collected at the same visit. The "
            "crew takes it to a recycling partner, and anything still usable goes to a "
            "furniture charity. Would you like me to add it?",
        ),
        Turn(
            "Hmm, the old one is staying at the previous flat with the landlord's furniture, "
            "so no removal this time.",
            "Understood, no removal then. That keeps the visit short: the crew will bring the "
            "sofa in, attach the feet and take all the packaging away with them.",
        ),
        Turn(
            "Do the feet come in different finishes? I saw oak and black ones in the showroom.",
            "They do. The Tamsin comes with natural oak feet as standard, and black-stained "
            "oak or brushed brass feet are available as an option. Changing the feet is easy "
            "and can be done at any time, even after delivery.",
        ),
        Turn(
            "I'll stay with the standard ones for now. How long is the warranty on the frame?",
            "The frame carries a 15-year warranty, and the cushions and the fabric are "
            "covered for two years against manufacturing faults. The warranty is registered "
            "automatically with the order, so there's nothing you need to do.",
        ),
        Turn(
            "Great. Should I be worried about the cushions flattening over time?",
            "The seat cushions are a foam core wrapped in fibre, which keeps its shape well. "
            "Plumping the back cushions every few days and turning the seat cushions now and "
            "then keeps the wear even. Some softening in the first months is normal.",
        ),
        Turn(
            "We also need a rug for the living room. Do you sell rugs?",
            "We do, in wool, jute and a washable cotton blend. With a toddler around, many "
            "parents go for the washable ones, which fit in a standard washing machine up to "
            "a size of 120 by 180 cm.",
        ),
        Turn(
            "A washable rug sounds perfect. Which colours would go with the sofa?",
            "Warm neutrals like sand and oatmeal work well with it, and a soft terracotta adds "
            "a bit of contrast without clashing. If you'd like, the showroom can lend you "
            "fabric samples to try at home.",
        ),
        Turn(
            "I'll ask for samples next time I'm there. Do you also sell cushions and throws?",
            "Yes, we have a small range of linen cushions and wool throws. They're in the "
            "accessories section of the website, and the showroom has most of them on display "
            "so you can feel the fabrics.",
        ),
        Turn(
            "Is there any discount if I order accessories together with the sofa?",
            "Accessories ordered within 30 days of a sofa get 15% off. Just use the same "
            "account when you order them, and the discount is applied at checkout.",
        ),
        Turn(
            "Nice. How will the sofa be packed? I'd like to know how much space to clear in "
            "the hallway.",
            "It comes wrapped in a padded cover and cardboard corners, and the crew unwraps it "
            "inside. Clear a path about a metre wide from the door to the living room, and "
            "move anything fragile out of the way.",
        ),
        Turn(
            "Does the crew need anything from us on the day?",
            "Only someone over 18 at home to let them in and sign the delivery note. If there "
            "is a parking permit zone outside, a visitor permit helps, but the crew can "
            "usually manage without one.",
        ),
        Turn(
            "There's a loading bay in front of the building, so parking should be easy.",
            "Perfect, that makes it easy for the crew. I'll add a note about the loading bay "
            "to the driver's instructions.",
        ),
        Turn(
            "How will I know the delivery is on its way?",
            "You'll get a text the evening before with a two-hour window, and the driver "
            "calls about 30 minutes before arriving. You can also follow the van on a live "
            "map from the link in the text.",
        ),
        Turn(
            "That's handy. Can I pay the remaining balance on delivery, or does it have to be "
            "paid in advance?",
            "The balance is taken automatically seven days before delivery, from the card you "
            "used for the deposit. You'll get a receipt by email, and nothing needs to be "
            "paid to the crew on the day.",
        ),
        Turn(
            "OK, that's simple. What if the sofa doesn't fit through the door?",
            "The crew checks the door and stairwell before carrying it up. The sofa's back "
            "can be removed, which gains about 20 cm, and if it still doesn't fit, we take it "
            "back and refund you in full.",
        ),
        Turn(
            "Good to know. Our cat likes scratching furniture, any advice?",
            "A scratching post placed right next to the sofa helps a lot, especially in the "
            "first weeks while the cat explores it. A throw over the arms protects the "
            "fabric, and clear protective tape on the corners discourages scratching.",
        ),
        Turn(
            "I'll get a scratching post then. Do you sell them, by any chance?",
            "We don't, I'm afraid, but pet shops have sturdy sisal posts that work well. "
            "Choose a tall, heavy one that doesn't wobble: cats ignore posts that move when "
            "they stretch against them, and go back to the furniture instead.",
        ),
        Turn(
            "Makes sense. What's the best way to protect the sofa from sunlight? The living "
            "room gets the sun all day.",
            "Strong sun fades most fabrics over time, the warm colours a little faster than "
            "the neutrals. A sheer curtain or a blind during the brightest hours helps a lot, "
            "and turning the seat cushions now and then keeps any fading even across the "
            "sofa.",
        ),
        Turn(
            "We'll get some blinds then. Is the sofa long enough to nap on? My husband is "
            "quite tall.",
            "The seat is about 190 cm from arm to arm, and the arms are low and padded, so "
            "most tall people can stretch out with their head on one arm. The seat depth is "
            "generous too, which makes it comfortable for naps.",
        ),
        Turn(
            "Perfect, he'll be pleased. Do you offer a sofa bed version of the same design?",
            "Not in this model, unfortunately. The closest design with a bed is the Marlow, "
            "which has a pull-out mattress of 140 by 190 cm. It's a little firmer to sit on, "
            "since the mechanism takes some of the depth of the seat.",
        ),
        Turn(
            "No, we'll stay with ours, we have a guest room anyway. Do you sell coffee tables?",
            "We do, in oak, walnut and a white-lacquered finish. The round oak ones are "
            "popular with families, because there are no sharp corners for little ones to "
            "bump into, and the oak can be sanded and oiled again if it gets scratched.",
        ),
        Turn(
            "A round one sounds safer with the toddler. How big are they?",
            "They come in 70 and 90 cm diameters. For a three-seater, the 90 cm one usually "
            "looks better, as long as you keep about 45 cm between the table and the front "
            "of the sofa so everyone can walk past comfortably.",
        ),
        Turn(
            "Good to know. Could the table come on the same delivery as the sofa?",
            "If you order it in the next few days, yes: tables are in stock and we can add it "
            "to the same visit at no extra delivery cost. The crew would bring it in and "
            "unwrap it together with the sofa.",
        ),
        Turn(
            "I'll talk to my husband tonight and order it online if he agrees.",
            "Sounds good. Once you've ordered, send me a quick message and I'll link the two "
            "orders so they arrive together. The accessory discount applies to the table as "
            "well, since it's within 30 days of the sofa.",
        ),
        Turn(
            "Lovely. How do I clean the oak feet and the table, by the way?",
            "A dry or slightly damp cloth is enough for everyday dust. Once or twice a year, "
            "a thin coat of furniture oil keeps the wood from drying out and brings the grain "
            "back. Avoid silicone sprays, which leave a film that's hard to remove.",
        ),
        Turn(
            "Noted. Is there anything I should know about the first days with a new sofa?",
            "New foam can smell a little for a day or two, so open a window if you notice it. "
            "The cushions also need a few weeks to soften and settle, so don't worry if the "
            "seat feels firmer than in the showroom at first.",
        ),
        Turn(
            "That's reassuring. If something is wrong with it, who do I contact?",
            "Write to us here or call the customer line, and have a photo of the problem "
            "ready. Most issues, such as a loose foot or a zip on a cushion cover, are sorted "
            "by sending a part, and anything bigger gets a technician visit at home.",
        ),
        Turn(
            "Thanks. Change of plan on the date, sorry: the movers are running late, so "
            "please deliver on March 21 instead of March 14.",
            "No problem, I've moved the delivery. The text with the two-hour window will come "
            "the evening before the new date, as before.",
        ),
        Turn(
            "And on the new day the afternoon slot would suit us better than the morning.",
            "Done: the afternoon slot runs from 12 noon to 5 pm. The driver will still call "
            "about 30 minutes before arriving.",
        ),
        Turn(
            "Perfect. By the way, a new tenant moves into our old flat on Alder Road on "
            "Monday, so please make sure nothing from you goes there anymore.",
            "Understood. Only the new address is on the order now, so the delivery and any "
            "letters from us will go there.",
        ),
        Turn(
            "Thanks for sorting all of this out so patiently.",
            "You're very welcome. Enjoy the new flat and the new sofa, and get in touch if "
            "anything else changes.",
        ),
    ),
    facts=(
        Fact("What is my surname, as I gave it to you?", ("Okonkwo-Hale", "Okonkwo Hale")),
        Fact("What is the number of my sofa order?", ("BL-73318",), superseded=("BL-40621",)),
        Fact("Which sofa model did I buy?", ("Tamsin",)),
        Fact("What colour is the sofa I ordered?", ("ochre",), superseded=("slate grey", "grey")),
        Fact(
            "On which street should the sofa be delivered?",
            ("Canal Street",),
            superseded=("Alder Road",),
        ),
        Fact(
            "On what date will the sofa be delivered?",
            (
                "March 21",
                "March 21st",
                "21 March",
                "21st March",
                "21st of March",
                "Mar 21",
                "21 Mar",
            ),
            superseded=("March 14", "March 14th", "14 March", "14th March", "Mar 14", "14 Mar"),
        ),
        Fact(
            "Which delivery time slot did I choose?",
            ("afternoon",),
            superseded=("morning",),
        ),
        Fact("Which floor do we live on?", ("third floor", "3rd floor")),
    ),
)

LONG = Conversation(
    name="long",
    instructions=(
        "You are a travel planner at Northbound Travel, helping a family plan a summer trip "
        "to Norway. Be warm and concise."
    ),
    turns=(
        Turn(
            "Hi! We booked a family trip to Norway with you in January, and I'd like to go "
            "through the plans. The booking reference is NB-6620-K.",
            "Hello, and thank you for booking with us! I've found the trip. It would help to "
            "know who I'm speaking with, and which parts of the plans you'd like to go "
            "through first.",
        ),
        Turn(
            "I'm Hannah Fairweather-Oduya, the lead traveller. There are four of us: my "
            "husband, our two kids and me.",
            "Lovely to meet you, Hannah. A family of four is a great size for Norway: easy to "
            "fit into cabins, boats and a hire car. Where would you like to start, the "
            "flights, the hotels or the day plans?",
        ),
        Turn(
            "Let's start with the flights. We'll fly out of Manchester, as that's closest to us.",
            "That works well: there are direct flights from there to Bergen in summer, so "
            "you won't need to change planes on the way out. The flight is about two hours.",
        ),
        Turn(
            "In Bergen we're staying at the Bryggen Fjordhus for the first three nights, right?",
            "That's right, it's on the old wharf, a short walk from the fish market and the "
            "funicular. The family room has a double bed and two singles, and breakfast is "
            "included every morning.",
        ),
        Turn(
            "Our total budget for the whole trip is £6,400, including the flights. I hope "
            "we're still within it.",
            "You are, with a comfortable margin for meals and activities. I'll keep an eye on "
            "it as we add things, and tell you before anything would push you over.",
        ),
        Turn(
            "One important thing: our daughter is coeliac, so she needs strictly gluten-free "
            "food everywhere we eat.",
            "Thank you for telling me. Norway is very good with this: most restaurants label "
            "allergens, and hotels can prepare a separate breakfast. I'll put a note on every "
            "booking so each place knows in advance.",
        ),
        Turn(
            "What's the weather usually like in Bergen in July?",
            "Mild and changeable: days are usually between 14 and 20 degrees, and Bergen is "
            "famous for its rain, so pack waterproof jackets for everyone. The long evenings "
            "make up for it, with daylight until almost midnight.",
        ),
        Turn(
            "Do the kids need anything special for the light nights? They're 6 and 9.",
            "Blackout curtains are common in hotels, but a couple of sleep masks are cheap "
            "insurance. Keeping a normal bedtime routine helps too, even when it's still "
            "bright outside at ten in the evening.",
        ),
        Turn(
            "Good tip. What should we do on the first afternoon in Bergen?",
            "Take it easy after the flight: a walk along the wharf, then the funicular up "
            "Mount Fløyen for the view. There's a playground and a lake at the top, and the "
            "kids can meet the goats that graze on the hillside.",
        ),
        Turn(
            "Goats! They'll love that. Is the funicular expensive?",
            "Not very: a family return ticket is a little over 500 kroner. You can also walk "
            "down through the forest, which takes about 45 minutes and is easy with kids.",
        ),
        Turn(
            "And the second day in Bergen?",
            "The aquarium is a good morning with kids, especially the penguin feeding. In the "
            "afternoon, the fish market and a ferry ride around the harbour give you a good "
            "feel for the city without too much walking.",
        ),
        Turn(
            "Sounds good. Can you recommend somewhere for dinner that's safe for our "
            "daughter's diet?",
            "There are several places on the wharf that handle it well and keep a dedicated "
            "fryer. I'll send you a short list with a few options, so you can choose on the "
            "day depending on what everyone feels like.",
        ),
        Turn(
            "Thanks. Now the part I'm least sure about: getting from Bergen to the fjords.",
            "The classic route is the train to Myrdal, the Flåm railway down the valley, and "
            "a boat through the Nærøyfjord. It takes a full day, but it's one of the most "
            "beautiful journeys in Norway and the kids will love the trains.",
        ),
        Turn(
            "Before I forget: our return flight home is SK4611, and my husband wants to "
            "know if we can pick seats together.",
            "Yes, seats can be chosen for free once online check-in opens, 30 hours before "
            "departure. I'll remind you the day before, so you can grab four seats together "
            "before the plane fills up.",
        ),
        Turn(
            "Great. Back to the fjords: do we need to book the Flåm railway in advance?",
            "In July, yes. The trains are popular and the afternoon departures often sell "
            "out. I'll book the seats with the rest of the journey, and try to get the side "
            "of the train with the waterfall view.",
        ),
        Turn(
            "There's a waterfall? The kids will want to see it.",
            "Kjosfossen: the train stops there for a few minutes so everyone can get out and "
            "look. It's loud and impressive, and you'll feel the spray from the platform.",
        ),
        Turn(
            "Where do we stay after the fjord trip?",
            "Two nights in a wooden cabin by the water near Gudvangen. It has a small "
            "kitchen, so you can cook some meals yourselves, which helps a lot with your "
            "daughter's diet and with the budget.",
        ),
        Turn(
            "A cabin sounds lovely. Is there a shop nearby?",
            "There's a small grocery in the village, about ten minutes by car, with a decent "
            "range of bread and pasta for special diets. For anything specific, it's safer to stock "
            "up in Bergen before you leave.",
        ),
        Turn(
            "By car? Do we need a car there?",
            "It makes the cabin days much easier. The plan is to pick up a hire car in Flåm "
            "and drive the rest of the trip, then drop it off at the airport at the end.",
        ),
        Turn(
            "Is driving in Norway difficult? My husband is a bit nervous about the tunnels.",
            "The roads are quiet and well kept, but narrow in places, and some tunnels are "
            "very long. They're well lit and have turning areas, so most drivers get used to "
            "them quickly. Take it slowly and enjoy the views.",
        ),
        Turn(
            "Which car did you book for us?",
            "A mid-size estate with space for four and the luggage, automatic gearbox, with "
            "two child seats. The hire confirmation number is HZ-88135; the desk in Flåm "
            "will ask for it with your husband's licence.",
        ),
        Turn(
            "Perfect. What's there to do around Gudvangen with kids?",
            "The Viking village is a big hit: you can try archery, axe throwing for older "
            "kids and see how people lived a thousand years ago. There are also easy walks "
            "along the river and a kayak trip on the fjord for families.",
        ),
        Turn(
            "Is the kayak trip safe for a 6-year-old?",
            "They use double kayaks with an adult in each, and the guides keep the group in "
            "the calm inner part of the fjord. Life jackets for children are provided. Most "
            "families find it the highlight of their trip.",
        ),
        Turn(
            "Sold. After the cabin, where do we go?",
            "You drive to Geiranger, which takes most of a day with stops. The road over the "
            "mountains has snow walls even in July, and there are good viewpoints on the way "
            "to stretch your legs.",
        ),
        Turn(
            "Snow in July, the kids won't believe it. How many nights in Geiranger?",
            "Three nights in a family hotel above the village, with a view over the fjord. "
            "It has a small pool, which is very welcome after a long drive.",
        ),
        Turn(
            "Any special plans in Geiranger?",
            "The Eagle Road viewpoint, the Seven Sisters waterfall from the boat, and a farm "
            "visit if the kids are keen on animals. It's a quieter part of the trip, so there's "
            "room for rest days too.",
        ),
        Turn(
            "Our wedding anniversary falls during the trip, on July 9. Could we have a nice "
            "dinner that evening?",
            "What a lovely occasion. I'll book a table at the hotel's restaurant with a fjord "
            "view, and ask if they can arrange a babysitter or an early meal for the kids so "
            "you two can have some time together.",
        ),
        Turn(
            "That would be wonderful, thank you. Is the restaurant expensive?",
            "It's one of the finer ones in the area, so a three-course dinner for two with "
            "wine is a treat, but it fits in your budget. I'll make sure they know about your "
            "daughter's diet for the kids' meal as well.",
        ),
        Turn(
            "What about money in general? Should we bring cash?",
            "Hardly any: cards are accepted almost everywhere, even for small amounts, and "
            "some places no longer take cash at all. A small amount of kroner for the odd "
            "market stall is enough.",
        ),
        Turn(
            "Good to know. And mobile data, will our phones work?",
            "Norway isn't in the EU, but most UK networks include it in their roaming "
            "bundles. Check with your provider before you go, and download offline maps in "
            "case there's no signal in the valleys.",
        ),
        Turn(
            "Will do. Is there a boat trip on the Geirangerfjord we should book?",
            "Yes, the sightseeing boat from the village pier. I'd take the morning one: it's "
            "calmer and less crowded. It leaves at 10:45 and takes about 90 minutes, passing "
            "the waterfalls and the old farms on the cliffs.",
        ),
        Turn(
            "The morning one it is. Do we need to bring anything on the boat?",
            "Warm layers, even on a sunny day: it's windy on deck. There's a café on board "
            "with snacks, but bring your daughter's own food to be safe.",
        ),
        Turn(
            "Where do we go after Geiranger?",
            "The last leg is the drive to Ålesund, about three hours with a ferry crossing. "
            "It's a pretty coastal town with colourful buildings, and you fly home from its "
            "airport after two nights there.",
        ),
        Turn(
            "What's there to do in Ålesund?",
            "Climb the 418 steps up Mount Aksla for the view, visit the aquarium on the coast, "
            "and wander through the old town. It's a relaxed end to the trip before the "
            "flight home.",
        ),
        Turn(
            "Another aquarium! The kids will be thrilled. Is it very different from Bergen's?",
            "It's smaller and focuses on the local sea life, with a big tank that shows the "
            "fish of the Atlantic coast. They also have seals and sometimes let kids help at "
            "feeding time.",
        ),
        Turn(
            "Lovely. What should we pack for the hiking bits?",
            "Sturdy walking shoes for everyone, waterproof jackets and trousers, a warm layer "
            "and a small backpack each for the kids. Trails are well marked, so you won't need "
            "special equipment.",
        ),
        Turn(
            "Do we need hiking poles, or is that overkill for the kids?",
            "For the kids it's overkill, but a pair for each adult helps on the steeper "
            "descents, especially on wet rock. Collapsible ones fit in a suitcase, and you "
            "can also rent them at most tourist offices for a small fee.",
        ),
        Turn(
            "We'll rent them then. Are there any walks you'd recommend near the cabin?",
            "There's a lovely trail up the side valley behind Gudvangen, about two hours "
            "there and back, that follows a river to a small waterfall. It's gentle enough "
            "for a six-year-old, and there are picnic spots with views over the fjord.",
        ),
        Turn(
            "A picnic by a waterfall sounds perfect. Are there ticks in Norway?",
            "There are, mainly in long grass and undergrowth along the coast. Long trousers "
            "tucked into socks help, and it's worth checking everyone in the evening, "
            "especially the kids' hairlines and behind the knees. A tick remover card is a "
            "good thing to pack.",
        ),
        Turn(
            "I'll add it to the list. What about swimming? Is the fjord water warm enough?",
            "Warm is a strong word! In July the fjords are usually around 15 to 18 degrees at "
            "the surface. Plenty of Norwegians swim anyway, and kids often love a quick dip, "
            "but have towels and warm clothes ready for afterwards.",
        ),
        Turn(
            "Brr. The hotel pool in Geiranger might be more their style.",
            "Probably! It's heated and has a shallow end for younger swimmers. There's also a "
            "small sauna for the adults, if you fancy the Norwegian way of warming up after "
            "a day outdoors.",
        ),
        Turn(
            "Can we see the northern lights in summer?",
            "Not in summer, unfortunately: the nights are too bright. The northern lights "
            "season runs from late September to March, so that would be a reason to come "
            "back one winter. In July you get the midnight light instead.",
        ),
        Turn(
            "A winter trip, now there's an idea for next year. Is Tromsø nice in winter?",
            "It's one of the best places for the northern lights, with husky sledding, "
            "whale watching and cosy cafés. Families love it around February, when the days "
            "are getting longer again. I'd be happy to plan it with you when the time comes.",
        ),
        Turn(
            "Let's get through this summer first! How do trains work with luggage in Norway?",
            "There's space at the end of each carriage and above the seats, and you can bring "
            "as much as you can carry yourselves. Soft bags are easier to fit than big hard "
            "suitcases, especially on the Flåm railway, which is busy in July.",
        ),
        Turn(
            "We'll try to pack light, though with kids that's always a challenge.",
            "It always is! Laundry helps: the cabin has a washing machine, so you only need "
            "clothes for about a week. Packing cubes for each family member also make it "
            "much easier to find things in the car.",
        ),
        Turn(
            "Packing cubes, good idea. Do you have a packing list you could send?",
            "Yes, we have a family packing list for Norway in summer. I'll add it to the "
            "email with the itinerary, together with the reading suggestions and the list "
            "of restaurants in Bergen.",
        ),
        Turn(
            "My son gets carsick. Any advice for the mountain roads?",
            "Let him sit in the front if he's old enough by the rules, or in the middle at the "
            "back where he can see the road ahead. Plan short breaks every hour, and keep some "
            "crackers and water handy.",
        ),
        Turn(
            "Good idea. Will we need travel insurance on top of the booking?",
            "I'd strongly recommend it, with cover for medical costs and cancellations. Make "
            "sure it covers outdoor activities like kayaking, and that your daughter's "
            "condition is declared if the insurer asks about medical conditions.",
        ),
        Turn(
            "I'll sort that out this week. Do the kids need passports, or is there a family "
            "document?",
            "Each child needs their own passport, valid for the whole trip. It's worth "
            "checking the expiry dates now, because renewals can take a few weeks in spring.",
        ),
        Turn(
            "I'll check tonight. Is there anything we should read before the trip?",
            "A children's book on Vikings is a nice way to get the kids excited, and for you "
            "two, a short guide to the fjords helps to understand what you're seeing. I can "
            "send a few suggestions by email.",
        ),
        Turn(
            "Yes please. How early should we be at the airport on the way home?",
            "Two hours before departure is plenty at Ålesund, as it's a small airport. Drop "
            "the hire car first: the car park is right next to the terminal.",
        ),
        Turn(
            "That's easy. Can we change anything later if we need to?",
            "Most parts can be changed until a month before departure, some with a small fee. "
            "Just tell me what you'd like to change and I'll check the conditions for each "
            "booking.",
        ),
        Turn(
            "Great. My mother might join us for the Bergen part, is that possible?",
            "Very likely: the hotel has rooms free on those dates, and she could fly out with "
            "you. If she decides to come, tell me soon so I can hold a room for her.",
        ),
        Turn(
            "I'll ask her this weekend. She's 74, is the Bergen part easy for her?",
            "Yes, Bergen is compact and the funicular does the climbing. The wharf and the "
            "market are flat, and there are plenty of cafés to rest in between.",
        ),
        Turn(
            "Thank you. I think that covers everything for now.",
            "You're welcome! It's a wonderful itinerary, and I'm sure the whole family will "
            "love it. I'll send a summary by email later today.",
        ),
        Turn(
            "One last question: what's the best souvenir to bring back from Norway?",
            "A hand-knitted wool jumper is the classic, though not cheap. For the kids, a "
            "small troll figure or a Viking helmet usually goes down well, and brown cheese "
            "is a fun one to share with friends at home.",
        ),
        Turn(
            "Brown cheese, we'll have to try it. Thanks again, bye for now!",
            "Goodbye, Hannah, and enjoy the planning. Don't hesitate to write if anything "
            "comes up.",
        ),
    ),
    facts=(
        Fact("What is the booking reference of our trip?", ("NB-6620-K",)),
        Fact("What is my surname, as I gave it to you?", ("Fairweather-Oduya",)),
        Fact("Which airport do we fly out of?", ("Manchester",)),
        Fact("Which hotel are we staying at in Bergen?", ("Bryggen Fjordhus",)),
        Fact("What is our total budget for the trip?", ("6,400", "6400", "6 400")),
        Fact(
            "What special diet does our daughter need?",
            ("gluten-free", "gluten free", "coeliac", "celiac"),
        ),
        Fact("What is the flight number of our return flight?", ("SK4611", "SK 4611")),
        Fact("What is the hire car's confirmation number?", ("HZ-88135",)),
        Fact(
            "On what date is our wedding anniversary dinner?",
            ("July 9", "9 July", "July 9th", "9th July", "9th of July", "Jul 9", "9 Jul"),
        ),
        Fact("At what time does the Geirangerfjord sightseeing boat leave?", ("10:45", "10.45")),
    ),
)

JAPANESE = Conversation(
    name="japanese",
    instructions=(
        "あなたはオンラインショップ「ことは家電」のカスタマーサポート担当です。"
        "丁寧かつ簡潔に、日本語で答えてください。"
    ),
    turns=(
        Turn(
            "こんにちは。昨日届いた炊飯器が壊れていたので連絡しました。山崎真理子と申します。",
            "山崎様、ご連絡ありがとうございます。お届けした商品に不具合があったとのこと、"
            "大変申し訳ございません。お調べしますので、ご注文番号を教えていただけますか。",
        ),
        Turn(
            "注文番号はKT-50917です。先月の半ばに注文しました。",
            "ありがとうございます。ご注文を確認いたしました。どのような状態だったか、"
            "詳しく教えていただけますでしょうか。外箱の様子もわかれば助かります。",
        ),
        Turn(
            "五合炊きの炊飯器で、色はテラコッタです。内釜に大きなへこみがあって、ふたの留め具も"
            "割れていました。箱の角もつぶれていました。",
            "詳しく教えていただきありがとうございます。輸送中の破損と考えられますので、"
            "配送保証の対象です。新品との交換、またはご返金のどちらかをお選びいただけます。",
        ),
        Turn(
            "交換でお願いします。送料込みで28,600円払ったので、返金してもらって買い直すのは"
            "避けたいです。",
            "かしこまりました。交換品は追加料金なしでお送りします。送料もかかりません。"
            "お届け先は、ご注文時のご住所でよろしいでしょうか。",
        ),
        Turn(
            "いいえ、先週引っ越したので、新しい住所の仙台市の方に送ってください。前の住所には"
            "もう誰もいません。",
            "承知いたしました。交換品は新しいご住所の仙台市へお送りし、以前のご住所には"
            "送らないように設定いたします。アカウントのご住所も後ほど更新をお願いいたします。",
        ),
        Turn(
            "それから、連絡はメールではなくショートメッセージでお願いできますか。メールは"
            "ほとんど見ないので。",
            "かしこまりました。発送のお知らせや追跡番号など、今後のご連絡はすべて"
            "ショートメッセージでお送りいたします。",
        ),
        Turn(
            "ちなみに、会員番号は3318-4420です。会員だと発送が早くなったりしますか。",
            "はい、会員様は交換品を優先的に発送いたします。通常は二、三営業日かかりますが、"
            "翌営業日には倉庫から出荷される予定です。",
        ),
        Turn(
            "よかったです。5月3日に実家で親戚が集まるので、それまでに届くと助かります。",
            "十分に間に合う見込みです。出荷後、通常二、三日でお届けできますので、余裕を"
            "持ってお受け取りいただけると思います。遅れそうな場合はすぐにご連絡いたします。",
        ),
        Turn(
            "壊れた炊飯器はどうすればいいですか。返送が必要ですか。",
            "はい、配送業者への補償請求のため、ご返送をお願いしております。着払いの返送伝票を"
            "お送りしますので、届いた箱に入れて三十日以内にお送りください。",
        ),
        Turn(
            "交換品が届く前に返送しないといけませんか。",
            "いいえ、交換品を先にお送りしますので、届いてからのご返送で大丈夫です。"
            "三十日以内であれば問題ございません。",
        ),
        Turn(
            "わかりました。ところで、この炊飯器は玄米も炊けますか。",
            "はい、玄米モードがございます。浸水時間を含めて九十分ほどかかりますが、"
            "ふっくら炊き上がります。雑穀米や炊き込みご飯のモードもございます。",
        ),
        Turn(
            "炊き込みご飯もできるんですね。予約タイマーはありますか。",
            "はい、最大十三時間後まで予約できます。夜にセットしておけば、朝に炊き立ての"
            "ご飯を召し上がれます。",
        ),
        Turn(
            "便利ですね。お手入れは大変ですか。",
            "内釜とふたの内側は取り外して洗えます。蒸気口も外せますので、月に一度ほど"
            "洗っていただくと、においがつきにくくなります。",
        ),
        Turn(
            "内釜は食洗機に入れても大丈夫ですか。",
            "内釜はコーティングを長持ちさせるため、手洗いをおすすめしております。"
            "柔らかいスポンジと中性洗剤で洗っていただければ十分です。",
        ),
        Turn(
            "なるほど。保証期間はどのくらいですか。",
            "本体は一年間のメーカー保証がございます。交換品は新品扱いになりますので、"
            "お届け日から新たに一年間の保証が始まります。",
        ),
        Turn(
            "延長保証はありますか。",
            "はい、有料で三年間まで延長できます。ご希望でしたら、交換品のお届け後に"
            "マイページからお申し込みいただけます。",
        ),
        Turn(
            "考えておきます。ところで、同じシリーズの電気ケトルもありますか。",
            "はい、同じデザインの電気ケトルがございます。容量は一リットルで、温度を"
            "五段階で設定できますので、お茶やコーヒーにも便利です。",
        ),
        Turn(
            "炊飯器と同じ色もありますか。",
            "はい、炊飯器と同じ色展開でご用意しております。並べて置いていただくと、"
            "キッチンに統一感が出ると好評です。",
        ),
        Turn(
            "いいですね。まとめて買うと割引はありますか。",
            "現在、春のキャンペーン中で、キッチン家電を二点以上ご購入いただくと、"
            "合計金額から一割引きになります。",
        ),
        Turn(
            "キャンペーンはいつまでですか。",
            "今月末までとなっております。まだ少しお時間がございますので、ゆっくりご検討ください。",
        ),
        Turn(
            "ありがとうございます。引っ越したばかりで、キッチン用品をいろいろそろえたいんです。",
            "新生活の準備、楽しみですね。トースターや電子レンジなども取りそろえておりますので、"
            "何かございましたらお気軽にご相談ください。",
        ),
        Turn(
            "トースターはどんなものがありますか。",
            "四枚焼きのオーブントースターが人気です。温度調節ができ、グラタンや焼き芋も"
            "作れます。コンパクトなので一人暮らしや二人暮らしの方にもおすすめです。",
        ),
        Turn(
            "焼き芋もできるんですね。子どもが喜びそうです。",
            "お子様にも大人気です。アルミホイルに包んで低めの温度でじっくり焼くと、"
            "甘くてしっとりした焼き芋になります。",
        ),
        Turn(
            "電子レンジも探しているのですが、おすすめはありますか。",
            "オーブン機能付きの電子レンジが人気です。容量は二十六リットルで、グリルや"
            "スチーム調理もできます。ターンテーブルのないフラットタイプなので、お手入れも"
            "簡単です。",
        ),
        Turn(
            "スチーム調理はどんな料理に使えますか。",
            "蒸し野菜や茶わん蒸し、肉まんの温め直しなどに便利です。油を使わずに調理できる"
            "ので、ヘルシーな料理を作りたい方に好評です。レシピ集も付属しております。",
        ),
        Turn(
            "レシピ集があるのはうれしいです。子ども向けのメニューも載っていますか。",
            "はい、蒸しパンやかぼちゃのプリンなど、お子様と一緒に作れるおやつのレシピも"
            "載っております。材料も身近なものばかりなので、気軽にお試しいただけます。",
        ),
        Turn(
            "楽しそうですね。電子レンジの保証も一年ですか。",
            "はい、電子レンジもメーカー保証は一年間で、延長保証も同じくお申し込み"
            "いただけます。キッチン家電をまとめてご購入の場合も、保証は商品ごとに"
            "登録されます。",
        ),
        Turn(
            "設置はお願いできますか。重そうなので。",
            "はい、電子レンジは有料の設置サービスがございます。配送員が開梱して設置し、"
            "動作確認まで行います。梱包材もそのまま持ち帰りますので、ごみが出ません。",
        ),
        Turn(
            "それは助かります。今は引っ越しの段ボールでいっぱいなので。",
            "引っ越し直後は本当に大変ですよね。少しずつ片付けて、新しいキッチンが"
            "使いやすくなるとよいですね。何かお手伝いできることがあれば、お申し付け"
            "ください。",
        ),
        Turn(
            "ありがとうございます。ところで、お米はどのくらいの量を炊くのがおいしいですか。",
            "五合炊きの場合、三合前後で炊くと、いちばんおいしく炊き上がると言われています。"
            "少量の場合は、少量炊きモードをお使いいただくと、ふっくら仕上がります。",
        ),
        Turn(
            "少量炊きモードもあるんですね。保温は何時間まで大丈夫ですか。",
            "保温は最大二十四時間まで可能ですが、おいしく召し上がれるのは十二時間ほど"
            "までです。長く保存する場合は、小分けにして冷凍していただくのがおすすめです。",
        ),
        Turn(
            "冷凍したご飯は、電子レンジで温めればいいですか。",
            "はい、ラップに包んで冷凍したご飯は、電子レンジの温めボタンで簡単に戻せます。"
            "少し水をふりかけてから温めると、炊き立てに近い食感になります。",
        ),
        Turn(
            "いいことを聞きました。お米の保存方法にもコツはありますか。",
            "お米は高温多湿を避けて、密閉容器に入れて冷蔵庫の野菜室で保存すると、"
            "風味が長持ちします。精米日から一か月ほどで食べきれる量を買うのが理想です。",
        ),
        Turn(
            "交換品の追跡番号は、発送されたらすぐにわかりますか。",
            "はい、配送業者が荷物を受け付けた時点で、追跡番号をお知らせいたします。"
            "通常、出荷から数時間以内にお送りしております。",
        ),
        Turn(
            "日中は仕事で不在のことが多いのですが、置き配はできますか。",
            "はい、追跡ページから置き配の場所をご指定いただけます。宅配ボックスや"
            "玄関前などをお選びいただけます。",
        ),
        Turn(
            "返送伝票は着払いとのことですが、コンビニからでも送れますか。",
            "はい、提携のコンビニからお送りいただけます。受付の際の控えは、返送の"
            "到着を確認するまで保管しておいてください。",
        ),
        Turn(
            "いろいろ質問してすみません。初めての交換なので不安で。",
            "とんでもございません。ご不安な点を解消していただくのが私どもの役目です。"
            "交換品で、おいしいご飯を炊いていただければうれしいです。",
        ),
        Turn(
            "丁寧に対応していただいて、ありがとうございました。",
            "こちらこそ、ありがとうございました。ほかにも何かございましたら、"
            "いつでもお気軽にご連絡ください。",
        ),
    ),
    facts=(
        Fact("私の名字を、私が伝えたとおりに教えてください。", ("山崎",)),
        Fact("私の注文番号は何でしたか。", ("KT-50917",)),
        Fact("注文した炊飯器の色は何ですか。", ("テラコッタ",)),
        Fact("送料込みでいくら払いましたか。", ("28,600", "28600", "2万8600", "2万8千6百")),
        Fact("交換品はどの市に送りますか。", ("仙台",)),
        Fact("連絡はどの方法でお願いしましたか。", ("ショートメッセージ", "SMS")),
        Fact("私の会員番号は何ですか。", ("3318-4420",)),
        Fact("親戚が集まるのは何月何日ですか。", ("5月3日", "五月三日", "5/3")),
    ),
)

CONVERSATIONS = (CORRECTIONS, LONG, JAPANESE)
"""The conversations, in the order they run."""
